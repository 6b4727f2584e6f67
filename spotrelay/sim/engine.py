"""The event loop and the physics every policy shares: nodes boot, train, checkpoint, get reclaimed
and are billed (the training progress is ``training.py``, which ``Run`` inherits). Policies
(``controller.py`` for spotrelay, ``baselines.py``) decide what to launch where and react to what
happens; nothing here decides.

Training is not simulated step by step: while a gang runs, the step reached at time t is
``start_step + (t - start) / step_eff`` (``step_eff`` = step time + the periodic snapshot stall
spread over the checkpoint interval). Periodic checkpoints land every ``every_steps`` steps and
are committed ``persist_s`` later; the only events are market events of held nodes, boots, the
end of training and the policy's own timers, which is what makes months cheap to simulate.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable
from typing import Any

from spotrelay.domain.cost import CostEntry, interruption_is_free
from spotrelay.sim import billing, losses
from spotrelay.sim.job import JobModel
from spotrelay.sim.market import Market, SimPool, TraceCapacity
from spotrelay.sim.records import INF, Fault, Metrics, SimNode
from spotrelay.sim.training import Training

# events in a row at one simulated time before a run is failed as stuck (a policy that answers an event
# with another at the same instant for ever, which the horizon never ends); a gang's launch, boots and
# notices at one time are a few hundred
STUCK_EVENTS = 1_000_000
HORIZON_S = 400 * 86400.0  # a run's clock stops here unless told (runner.make_run tells it)
_LAUNCHED_KEEP = 1024  # Run.launched is pruned of ended nodes when it grows past this (or twice what it kept)


class Run(Training):
    """One job under one policy on one market and seed."""

    def __init__(self, market: Market, job: JobModel, seed: int, start_t: float = 0.0,
                 horizon_s: float = HORIZON_S, timeline: bool = False, faults: tuple[Fault, ...] = ()) -> None:
        super().__init__(job)  # (the training state: sim/training.py)
        self.market, self.job = market, job
        self.rng = random.Random(f"{seed}/run")
        self.now = self.start_t = start_t
        self.horizon = start_t + horizon_s
        self._heap: list[tuple[float, int, Callable[..., None], Any]] = []
        self._seq = itertools.count()
        if job.deadline_hours is not None:  # (a time-boxed job: every policy stops then)
            self.at(start_t + job.deadline_hours * 3600.0, self._deadline)
        self.held: dict[str, set[object]] = {}
        self.gang: dict[int, SimNode] = {}  # rank -> node of the current attempt
        self.bench: dict[str, SimNode] = {}  # instance id -> hot spare standing by (policies that have them)
        self.entries: list[CostEntry] = []
        self.paid_gpu_s = 0.0
        self.od_gpu_s = 0.0
        self.metrics = Metrics()
        self.keep_timeline = timeline
        self.faults = faults
        self._ids = itertools.count(1)
        self.last_region: str | None = None
        self._watched: set[str] = set()
        self.launched: list[SimNode] = []  # every node launched that may still be billed (in launch order)
        self._launched_keep = _LAUNCHED_KEEP
        self._bills: dict[tuple[str, float, float, int], list[CostEntry]] = {}  # end_node's last node's entries
        self.loss_gpu_s: dict[str, float] = {}  # paid GPU-s per phase (sim/losses.py): "train", "boot", ...

    # --- event loop -----------------------------------------------------------------------------
    def at(self, t: float, fn: Callable[..., None], arg: Any = None) -> None:
        heapq.heappush(self._heap, (t, next(self._seq), fn, arg))

    def loop(self) -> None:
        heap, pop, metrics, horizon = self._heap, heapq.heappop, self.metrics, self.horizon
        events = 0  # (counted here, stored once: the loop runs millions of times a sweep)
        same, last = 0, self.now  # events in a row at one simulated time: the horizon cannot end a loop
        while heap and not metrics.finished and metrics.failed_reason is None:
            t, _, fn, arg = pop(heap)
            if t > horizon:
                metrics.failed_reason = "did not finish within the simulated horizon"
                self.now = horizon
                break
            if t == last:
                same += 1
                if same > STUCK_EVENTS:
                    metrics.failed_reason = f"no progress: {same:,} events in a row at one simulated time"
                    break
            else:
                same, last = 0, t
            self.now = t
            events += 1
            fn(arg)
        metrics.events += events
        self.release_all()
        self.bill_leftovers()

    def _deadline(self, _: Any) -> None:
        """The job's deadline (``JobModel.deadline_hours``): training stops where it is, its ranks save
        that step (a planned stop: nothing is lost), and the run ends; every node stops billing now."""
        if self.metrics.finished or self.metrics.failed_reason is not None:
            return
        if self.running:
            self.stop_training(int(self.step_at(self.now) + 1e-6))
        self.metrics.deadline_cut = self.ckpt_step < self.total
        self.note("", f"deadline: step {self.ckpt_step} of {self.total}")
        self.finish()

    def note(self, pool: str, what: str) -> None:
        if self.keep_timeline:
            self.metrics.timeline.append((self.now - self.start_t, pool, what))

    # --- nodes ----------------------------------------------------------------------------------
    def launch(self, sp: SimPool, ranks: list[int], attempt: int, *, unlimited: bool = False) -> list[SimNode] | None:
        """Gang-launch ``ranks`` in ``sp`` now (all or none); None when the pool has no capacity."""
        held = self.held.setdefault(sp.key, set())
        grants: list[tuple[object, float]]
        if unlimited:
            grants = [(("pl", next(self._ids)), INF) for _ in ranks]
        else:
            got = self.market.grant(sp, self.now, len(ranks), held, self.rng)
            if got is None:
                self.metrics.capacity_failures += 1
                return None
            grants = [(g.key, g.removal_t) for g in got]
        nodes = []
        boot = self.market.boot_mean(sp.pool.instance_type)
        spread = self.market.boot_spread
        for rank, (key, removal) in zip(ranks, grants, strict=True):
            held.add(key)
            announced = self.rng.random() >= self.market.unannounced_share
            node = SimNode(rank=rank, pool=sp, key=key, attempt=attempt, instance_id=f"i-{next(self._ids):07d}",
                           launch_t=self.now, boot_t=self.now + boot * self.rng.uniform(1 - spread, 1 + spread),
                           removal_t=removal, announced=announced)
            nodes.append(node)
            self.launched.append(node)
            if removal < INF:
                self.reclaim(node, removal)
            self.at(node.boot_t, self._booted, node)
        if len(self.launched) > self._launched_keep:  # only nodes still billed matter (bill_leftovers):
            # drop the ended ones, in order, so a stormy run's thousands of gangs are freed as they go
            self.launched = [n for n in self.launched if n.end_t is None]
            self._launched_keep = max(_LAUNCHED_KEEP, 2 * len(self.launched))
        cap = sp.capacity
        if (not unlimited and isinstance(cap, TraceCapacity) and cap.semantics == "capacity"
                and sp.key not in self._watched):
            self._watched.add(sp.key)
            drop = cap.next_drop(self.now)
            self.at(max(self.now, drop - self.job.notice_s), self._watch, (sp, drop))
        if self.last_region is not None and sp.pool.region != self.last_region:
            self.metrics.cross_region_moves += 1
        self.last_region = sp.pool.region
        self.note(sp.key, f"launch {len(ranks)} ({'spot' if sp.spot else 'on-demand'}) attempt {attempt}")
        return nodes

    def reclaim(self, node: SimNode, removal: float, rebalance: bool = True) -> None:
        """The market takes ``node`` back at ``removal``: notice 120 s before unless unannounced.

        Its events (rebalance, notice, removal) are a chain: only the next one is in the heap, the next
        pushed when it fires, each with the sequence number it would have had pushed now (so they pop
        in the same order among every other event). Most nodes end first (a move, a relaunch): their
        later events, no-ops once the node ended, are never pushed (two fifths of a stormy run's events)."""
        node.removal_t = removal
        seq = self._seq
        links: list[tuple[float, int, Callable[[SimNode], None]]] = []
        if node.announced:
            links.append((max(self.now, removal - self.job.notice_s), next(seq), self._notice))
            if rebalance and self.rng.random() < self.market.rebalance_share:
                when = removal - self.job.notice_s - self.rng.uniform(600.0, 1800.0)
                if when > self.now:
                    links.append((when, next(seq), self._rebalance))
        links.append((removal, next(seq), self._removed))
        links.sort()  # by time, then sequence (unique: the handlers are never compared)
        t, s, fn = links[0]
        heapq.heappush(self._heap, (t, s, self._chained, (node, fn, links[1:])))

    def _chained(self, arg: tuple[SimNode, Callable[[SimNode], None], list[tuple[float, int, Any]]]) -> None:
        node, fn, rest = arg
        if node.end_t is not None:
            return  # (each of its handlers does nothing for an ended node, so neither would the rest)
        fn(node)
        if rest and node.end_t is None:
            t, s, nxt = rest[0]
            heapq.heappush(self._heap, (t, s, self._chained, (node, nxt, rest[1:])))

    def _watch(self, arg: tuple[SimPool, float]) -> None:
        """Capacity semantics: at a drop's notice time, reclaim what the pool can no longer hold."""
        sp, drop = arg
        cap = sp.capacity
        assert isinstance(cap, TraceCapacity)
        mine = [n for n in self._live_in(sp) if n.removal_t == INF]
        if not mine:
            self._watched.discard(sp.key)
            return
        excess = len(mine) - cap.capacity(drop)
        if excess > 0:
            for node in self.rng.sample(mine, excess):
                self.reclaim(node, drop, rebalance=False)
        following = cap.next_drop(drop + 5e-4)  # strictly after this one (trace times are whole ms)
        self.at(max(self.now, following - self.job.notice_s), self._watch, (sp, following))

    def _live_in(self, sp: SimPool) -> list[SimNode]:
        return [n for n in (*self.gang.values(), *self.bench.values()) if n.pool is sp and n.end_t is None]

    def end_node(self, node: SimNode, state: str = "TERMINATED", by_ec2: bool = False) -> None:
        """Stop billing ``node`` (terminated by us or reclaimed: ``by_ec2``) and free its place in the
        pool. EC2's interruption of a spot node in its first hour is not billed (domain/cost.py), nor is
        a node left to it (``left_to_ec2``, ended here only when the run ends first)."""
        if node.end_t is not None:
            node.state = state if node.state != "LOST" else node.state
            return
        node.end_t = self.now
        node.state = state
        if self.running and node in self.seg_nodes:  # a member of the training gang is gone: it stops
            self.stop_training(self.committed(self.now))
        self.held.get(node.pool.key, set()).discard(node.key)
        sp = node.pool
        speed = self._node_speed(node)
        gpu_s = (self.now - node.launch_t) * sp.gpus * speed
        self.paid_gpu_s += gpu_s
        losses.charge_node(self.loss_gpu_s, node, self.now, sp.gpus * speed)
        if not sp.spot:
            self.od_gpu_s += gpu_s
        # a gang's nodes launch and end together: their entries are the same (frozen) objects, made once
        attempt = max(1, node.attempt)
        if (by_ec2 or node.left_to_ec2) and interruption_is_free(
                sp.pool.market, node.launch_t, self.now if by_ec2 else node.removal_t):
            return  # (its GPU-hours still count as held: goodput's denominator does not shrink)
        key = (sp.key, node.launch_t, self.now, attempt)
        bills = self._bills.get(key)
        if bills is None:
            bills = billing.slot_bills(attempt, sp, node.launch_t, self.now, self.bill_price)
            self._bills = {key: bills}
        self.entries.extend(bills)

    def bill_price(self, sp: SimPool, t: float) -> float:
        """USD per hour a node of ``sp`` pays at ``t`` (the price-limit bound overrides it)."""
        return sp.price(t)

    def dispose(self) -> None:
        """Drop what the finished run holds, once it is measured: its event heap and workflow walker
        hold bound methods of it (a cycle), so its nodes and records would otherwise wait for a full
        collection, which a sweep of many runs makes rare (runner._rare_collections)."""
        state = getattr(self, "__dict__", None)
        if state is not None:
            state.clear()
        else:  # the native build's runs have no ``__dict__`` (spotrelay/sim_native.py): the cycles' links, by name
            self._heap.clear()
            self.drop_links()

    def drop_links(self) -> None:
        """What a policy holds that refers back to the run (the native build's ``dispose``)."""

    def release_all(self) -> None:
        for node in list(self.bench.values()):
            self.end_node(node)
        self.bench.clear()
        for node in list(self.gang.values()):
            self.end_node(node, "TERMINATED" if node.state != "LOST" else "LOST")

    def bill_leftovers(self) -> None:
        """At the end: nodes outside the gang still billed (draining after a notice) stop now."""
        for node in self.launched:
            if node.end_t is None:
                self.end_node(node)

    def _booted(self, node: SimNode) -> None:
        if node.end_t is None and node.state == "PENDING":
            node.state = "READY"
            self.on_booted(node)

    def _notice(self, node: SimNode) -> None:
        if node.end_t is None:
            self.on_notice(node)

    def _rebalance(self, node: SimNode) -> None:
        if node.end_t is None:
            self.on_rebalance(node)

    def _removed(self, node: SimNode) -> None:
        if node.end_t is None:
            announced = node.announced
            self.end_node(node, "TERMINATED" if announced or node.state == "EXITED" else "LOST", by_ec2=True)
            self.on_removed(node, announced)

    # --- training (the rest is sim/training.py) ------------------------------------------------
    def start_training(self, instance_type: str, gpus: int, world: int | None = None) -> None:
        super().start_training(instance_type, gpus, world)
        self._scripted_faults()

    def _scripted_faults(self) -> None:
        """A scenario's faults (``Fault``) due in this attempt are scheduled when its training starts."""
        attempt = max((n.attempt for n in self.gang.values()), default=0)
        for fault in self.faults:
            if fault.attempt == attempt and fault.step > self.seg_step0 and fault.rank in self.gang:
                node = self.gang[fault.rank]
                when = self.now + (fault.step - self.seg_step0) * self.step_eff
                node.announced = fault.kind != "kill"
                node.crashed = fault.kind == "kill"
                if fault.kind == "rebalance":
                    self.at(when, self._rebalance, node)
                    when += fault.lead_s
                self.reclaim(node, when + (self.job.notice_s if node.announced else 0.0), rebalance=False)

    # --- policy hooks ---------------------------------------------------------------------------
    def on_booted(self, node: SimNode) -> None: ...

    def on_notice(self, node: SimNode) -> None: ...

    def on_rebalance(self, node: SimNode) -> None: ...

    def on_removed(self, node: SimNode, announced: bool) -> None: ...

    def finish(self) -> None:
        self.metrics.finished = True
        self.note("", "finished")

