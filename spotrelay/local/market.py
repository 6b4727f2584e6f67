"""The twin's market: prices, boot time, capacity errors and interruptions (DESIGN.md section 7).

One object answers the controller's ``MarketData`` port and tells the local compute adapter what EC2
would do: how long a launch takes to boot (modeled, then scaled down), which pools are out of
capacity, and when spot instances are taken back. Chaos is either scripted (``interrupt rank 1 at
step 12``, ``capacity error in pool P twice``) or replayed from a real preemption trace
(``data/bamboo-g4dn-trace.csv``, MIT, see ``data/LICENSE-bamboo``).
"""

from __future__ import annotations

import csv
import fnmatch
import hashlib
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from spotrelay.domain.models import Pool
from spotrelay.errors import InsufficientCapacityError
from spotrelay.placement import catalog
from spotrelay.ports.market import PoolQuote

TRACE = Path(__file__).resolve().parent / "data" / "bamboo-g4dn-trace.csv"

# Fallbacks for instance types the placement catalog does not list (USD per instance-hour).
ON_DEMAND_PRICE: dict[str, float] = {"g5.xlarge": 1.006, "g4dn.xlarge": 0.526}
DEFAULT_ON_DEMAND = 10.0


def az_names(region: str, count: int) -> list[str]:
    return [f"{region}{chr(ord('a') + i)}" for i in range(count)]


def _unit(*parts: str) -> float:
    """A stable number in [0, 1) from strings: prices vary by pool but never between runs."""
    digest = hashlib.sha256("/".join(parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


@dataclass
class ChaosAction:
    """One scripted fault. ``node`` names a rank (``"1"``), a node id (``"a1-r1"``) or an instance id."""

    kind: Literal["interrupt", "kill"]
    node: str
    at_step: int | None = None  # fire when the job reaches this step...
    at_s: float | None = None  # ...or this many seconds after the twin started
    attempt: int | None = None  # only in this attempt (None: the first attempt that reaches it)
    # just before it fires, every pool shrinks to this many instances (CapacityLimit): the capacity
    # that the node being taken held is gone for the whole gang (``demo --scenario elastic``)
    limit_nodes: int | None = None
    fired: bool = False

    @classmethod
    def parse(cls, text: str) -> ChaosAction:
        """``interrupt:1@step=12``, ``kill:a2-r0@t=30``, ``interrupt:1`` (now)."""
        kind, _, rest = text.partition(":")
        node, _, when = rest.partition("@")
        if kind not in ("interrupt", "kill") or not node:
            raise ValueError(f"chaos action '{text}' is not KIND:NODE[@step=N|@t=S]")
        action = cls(kind=kind, node=node)  # type: ignore[arg-type]
        if when.startswith("step="):
            action.at_step = int(when[5:])
        elif when.startswith("t="):
            action.at_s = float(when[2:])
        elif when:
            raise ValueError(f"chaos trigger '{when}' is not step=N or t=S")
        return action


@dataclass
class CapacityRule:
    """``pool`` is a glob over pool keys (``us-east-1/*/p5.48xlarge/spot``); ``times`` launches fail.
    With ``until`` (a ``time.monotonic()`` deadline) it is an outage instead: every launch there fails
    until then, however often it is tried. A real shortage ends with time, not with the number of
    launches refused; counted, a controller that backs off (pool cooldowns) would make it last longer."""

    pool: str
    times: int = 1
    until: float | None = None


@dataclass
class CapacityLimit:
    """While it lasts, each pool matching ``pool`` (a glob over pool keys) holds at most ``nodes`` of
    the twin's instances: the rest of the market took the others (``spotrelay demo --scenario elastic``
    drops it to fewer nodes than the gang, then lifts it). A launch that would pass it fails whole."""

    pool: str = "*"
    nodes: int = 0


@dataclass
class MarketModel:
    regions: list[str] = field(default_factory=lambda: ["us-east-1"])
    azs_per_region: int = 2
    spot_discount: float = 0.65  # typical spot price is 35% of on-demand, +-10% by pool
    boot_time_s: float = 300.0  # modeled EC2 launch -> agent up for a GPU instance
    time_scale: float = 0.01  # twin seconds per modeled second: boots (300 s -> 3 s) and Plan's waits (twin.py)
    # Notice -> reclaim, in twin seconds. EC2 gives 120 s; the twin shortens it but not by the boot
    # scale, because the save the notice triggers is real work on this machine.
    notice_window_s: float = 30.0
    capacity: list[CapacityRule] = field(default_factory=list)
    limits: list[CapacityLimit] = field(default_factory=list)
    chaos: list[ChaosAction] = field(default_factory=list)
    trace_removals_s: list[float] = field(default_factory=list)  # twin seconds, from a trace
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    # --- MarketData port ---------------------------------------------------------------------
    def quotes(self, regions: list[str], instance_types: list[str], markets: list[str],
               capacity: int = 1, scores: bool = True) -> list[PoolQuote]:
        out: list[PoolQuote] = []
        for region in regions:
            for itype in instance_types:
                for az in catalog.zones(region, itype)[: self.azs_per_region] or az_names(region, self.azs_per_region):
                    for market in markets:
                        out.append(self.quote(Pool(region=region, az=az, instance_type=itype, market=market)))
        return out

    def quote(self, pool: Pool) -> PoolQuote:
        od = catalog.on_demand_price(pool.region, pool.instance_type) or ON_DEMAND_PRICE.get(
            pool.instance_type, DEFAULT_ON_DEMAND
        )
        if pool.market != "spot":
            return PoolQuote(pool=pool, price_per_hour=round(od, 4))
        jitter = _unit(pool.key, "price") * 0.2 - 0.1  # pools of one type differ a little, stably
        band = catalog.advisor_band(pool.region, pool.instance_type)
        if band is None:
            band = int(_unit(pool.key, "band") * 3)
        score = round(3 + _unit(pool.key, "score") * 7, 1)
        typical = catalog.typical_spot_price(pool.region, pool.instance_type) or od * (1 - self.spot_discount)
        price = typical * (1 + jitter)
        return PoolQuote(pool=pool, price_per_hour=round(price, 4), advisor_band=band, placement_score=score)

    def price_history(self, pool: Pool, start: float, end: float) -> list[tuple[float, float]]:
        """The twin's prices do not move: its quote's, in effect throughout."""
        return [(start, self.quote(pool).price_per_hour)]

    def on_demand_price(self, instance_type: str, region: str = "us-east-1") -> float:
        return self.quote(
            Pool(region=region, az=f"{region}a", instance_type=instance_type, market="on-demand")
        ).price_per_hour

    # --- what the compute adapter asks -------------------------------------------------------
    def check_capacity(self, pool: Pool, count: int = 1, live: int = 0) -> None:
        """Raise ``InsufficientCapacityError`` if a capacity rule matches this launch (a counted one is used up),
        or if ``count`` more instances next to the ``live`` ones there would pass a capacity limit."""
        now = time.monotonic()
        with self._lock:
            for rule in self.capacity:
                if not fnmatch.fnmatch(pool.key, rule.pool):
                    continue
                if rule.until is not None:
                    refused = now < rule.until  # an outage: a refusal does not use it up
                elif rule.times > 0:
                    rule.times -= 1
                    refused = True
                else:
                    refused = False
                if refused:
                    raise InsufficientCapacityError(
                        f"InsufficientInstanceCapacity: no {pool.instance_type} {pool.market} capacity in {pool.az}"
                    )
            for limit in self.limits:
                if fnmatch.fnmatch(pool.key, limit.pool) and live + count > limit.nodes:
                    raise InsufficientCapacityError(
                        f"InsufficientInstanceCapacity: {pool.az} has {max(limit.nodes - live, 0)} "
                        f"{pool.instance_type} {pool.market} instances left, {count} asked"
                    )

    def limit_capacity(self, nodes: int, pool: str = "*") -> CapacityLimit:
        """From now on pools matching ``pool`` hold at most ``nodes`` instances (until lifted)."""
        limit = CapacityLimit(pool=pool, nodes=nodes)
        with self._lock:
            self.limits.append(limit)
        return limit

    def lift_limits(self) -> int:
        """Capacity returns everywhere; how many limits there were."""
        with self._lock:
            n, self.limits = len(self.limits), []
            return n

    def boot_delay_s(self) -> float:
        """Twin seconds between launch and the instance's agent starting."""
        return self.boot_time_s * self.time_scale

    def notice_window(self) -> float:
        """Twin seconds between the spot notice and the instance being taken."""
        return self.notice_window_s

    def add_chaos(self, action: ChaosAction) -> None:
        """Script one more fault while the twin runs (the demo times its second fault from a resume)."""
        with self._lock:
            self.chaos.append(action)

    def due_chaos(self, step: int | None, elapsed_s: float, attempt: int) -> list[ChaosAction]:
        """Scripted actions whose trigger has been reached; each fires once."""
        due = []
        with self._lock:
            for action in self.chaos:
                if action.fired or (action.attempt is not None and action.attempt != attempt):
                    continue
                by_step = action.at_step is not None and step is not None and step >= action.at_step
                by_time = action.at_s is not None and elapsed_s >= action.at_s
                if by_step or by_time or (action.at_step is None and action.at_s is None):
                    action.fired = True
                    due.append(action)
        return due

    def due_trace_removals(self, elapsed_s: float) -> int:
        """How many trace removals have come due (each takes one spot instance); consumed."""
        with self._lock:
            n = sum(1 for t in self.trace_removals_s if t <= elapsed_s)
            self.trace_removals_s = [t for t in self.trace_removals_s if t > elapsed_s]
            return n

    def use_trace(
        self, path: Path = TRACE, speedup: float = 600.0, start_s: float = 0.0, limit: int | None = None
    ) -> None:
        """Replay the trace's removals ``speedup`` times faster, from trace second ``start_s``."""
        self.trace_removals_s = [(t - start_s) / speedup for t in load_removals(path) if t >= start_s][:limit]


def load_removals(path: Path = TRACE) -> list[float]:
    """Seconds (from the trace start) at which the cluster lost a node. Rows: ``ms,add|remove,node``."""
    times = []
    with open(path, newline="") as fh:
        for row in csv.reader(fh):
            if len(row) >= 2 and row[1].strip() == "remove":
                times.append(int(row[0]) / 1000.0)
    return sorted(times)


def trace_interruption_rate(path: Path = TRACE) -> float:
    """Removals per node-hour in the trace (the hazard the replay reproduces)."""
    live: dict[str, float] = {}
    node_seconds = 0.0
    removals = 0
    with open(path, newline="") as fh:
        for row in csv.reader(fh):
            if len(row) < 3:
                continue
            t, action, node = int(row[0]) / 1000.0, row[1].strip(), row[2].strip()
            if action == "add":
                live[node] = t
            elif action == "remove" and node in live:
                node_seconds += t - live.pop(node)
                removals += 1
    return removals / (node_seconds / 3600.0) if node_seconds else 0.0
