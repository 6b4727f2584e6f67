"""Fires the market model's faults at the twin's instances: scripted actions when a job reaches a
step (read from the trainer's progress file on the node, as an outside observer would) or a time,
and trace removals against a random live spot instance."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from spotrelay.contracts.control import read_progress
from spotrelay.domain.models import Node
from spotrelay.local.compute import LocalCompute, LocalInstance
from spotrelay.local.market import ChaosAction, MarketModel

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Fired:
    time: float
    kind: str  # interrupt | kill
    instance_id: str
    node: str  # a<attempt>-r<rank>
    step: int | None
    source: str  # script | trace


def node_step(li: LocalInstance) -> int | None:
    """The last step the trainer on this node reported (``<work>/control/progress.json``)."""
    return read_progress(li.work_dir / "control")


Places = dict[str, tuple[int, int]]  # instance id -> (attempt, rank) it serves now


def places_of(nodes: list[Node]) -> Places:
    """Where each instance trains now, from the node records: a survivor kept by replace-lost-nodes
    or a promoted spare serves a later attempt (and maybe another rank) than its launch tags say;
    a spare on the bench serves none."""
    out: Places = {}
    for node in sorted(nodes, key=lambda n: n.attempt):
        if node.spare:
            out.pop(node.instance_id, None)
        else:
            out[node.instance_id] = (node.attempt, node.rank)
    return out


class ChaosDriver:
    def __init__(self, market: MarketModel, compute: LocalCompute, seed: int = 7, every_s: float = 0.25,
                 where: Callable[[], Places] | None = None) -> None:
        self.market = market
        self.compute = compute
        self.where = where  # None: the launch tags (attempt, rank) say where an instance serves
        self.every_s = every_s
        self.fired: list[Fired] = []
        self.listeners: list[Callable[[Fired], None]] = []
        self._rng = random.Random(seed)
        self._t0 = time.time()
        self._places: Places = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="chaos")

    def start(self) -> ChaosDriver:
        self._t0 = time.time()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def tick(self) -> None:
        elapsed = time.time() - self._t0
        alive = [li for li in self.compute.instances() if li.alive and li.booted_at is not None]
        self._places = self.where() if self.where is not None else {}
        by_attempt: dict[tuple[str | None, int | None], list[LocalInstance]] = {}
        for li in alive:
            by_attempt.setdefault((li.instance.job_id, self._place(li)[0]), []).append(li)
        for (_, attempt), gang in by_attempt.items():
            steps = [s for s in (node_step(li) for li in gang) if s is not None]
            step = max(steps) if steps else None
            for action in self.market.due_chaos(step, elapsed, attempt or 0):
                self._fire(action, gang, step)
        for _ in range(self.market.due_trace_removals(elapsed)):
            spot = [li for li in alive if li.instance.pool.market == "spot" and li.notice_at is None]
            if spot:
                victim = self._rng.choice(spot)
                self._apply("interrupt", victim, None, "trace")

    def _place(self, li: LocalInstance) -> tuple[int | None, int | None]:
        return self._places.get(li.instance.instance_id, (li.instance.attempt, li.instance.rank)) \
            if self.where is None or li.instance.instance_id in self._places else (None, None)

    def _fire(self, action: ChaosAction, gang: list[LocalInstance], step: int | None) -> None:
        for li in gang:
            attempt, rank = self._place(li)
            if action.node in (li.instance.instance_id, f"a{attempt}-r{rank}", str(rank)):
                if action.limit_nodes is not None:  # before the fault: the replacement finds no room
                    self.market.limit_capacity(action.limit_nodes)
                self._apply(action.kind, li, step, "script")
                return
        log.warning(
            "chaos %s:%s found no live node in attempt %s",
            action.kind,
            action.node,
            gang[0].instance.attempt if gang else None,
        )

    def _apply(self, kind: str, li: LocalInstance, step: int | None, source: str) -> None:
        iid = li.instance.instance_id
        at = time.time()  # the fault itself: the kill waits for the process tree to go
        if kind == "interrupt":
            self.compute.interrupt(iid)
        else:
            self.compute.kill(iid)
        attempt, rank = self._place(li)
        fired = Fired(at, kind, iid, f"a{attempt}-r{rank}", step, source)
        self.fired.append(fired)
        for listener in self.listeners:
            listener(fired)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.tick()
            except Exception:
                log.exception("chaos tick failed")
