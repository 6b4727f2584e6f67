"""The simulated market: every pool's price, capacity and reclaims over time.

A pool is (region, AZ, instance type, market), as in placement. On-demand pools have unlimited
capacity and no reclaims (hardware failures aside, which the simulator leaves out). A spot pool's
capacity comes from one of two models:

- ``TraceCapacity`` (Bamboo traces): the trace's nodes ARE the pool's spot instances. A launch of
  k nodes takes k of the nodes alive now that this job does not already hold (all or none: gang
  launches are ``MinTargetCapacity = count``); each one is reclaimed when the trace removes it,
  so removals at the same millisecond are correlated reclaims. The trace wraps around; pool i
  other than the first sees it shifted by a seeded offset.
- ``SlotCapacity`` (pools CSV and the synthetic generator): capacity per time slot and a reclaim
  rate per instance-hour; a node's lifetime is exponential at the rate of the slot it started in,
  and a slot whose capacity falls below what the job holds reclaims the excess at its start.

Every reclaim comes with the 120 s notice except an ``unannounced_share`` of them; a
``rebalance_share`` also get a rebalance recommendation 10-30 min ahead (when the node was up then).

Placement scores sized for the launch (``quotes(t, capacity=n)``, as ``Ec2MarketData`` asks
``GetSpotPlacementScores`` for the gang): where the pool's capacity now is known (traces, the
synthetic slots, a pools CSV without a recorded score), ``scores.gang_score`` derives a coarse 1-10 score
from the free capacity over the gang, with noise (a normal of 1.5 points, drawn per pool and
10-minute window): it tells placement roughly, not exactly, which pools can hold the gang now.
A pools CSV's recorded ``placement_score`` is used as recorded.
"""

from __future__ import annotations

import bisect
import fnmatch
import random
from collections.abc import Hashable
from dataclasses import dataclass, field

from spotrelay.domain.models import Pool
from spotrelay.placement import catalog
from spotrelay.ports.market import PoolQuote
from spotrelay.sim.inputs import PoolTable, Slot, Trace
from spotrelay.sim.quotes import QuoteBook
from spotrelay.sim.scores import SCORE_WINDOW_S, gang_score

NOTICE_S = 120.0  # EC2 spot interruption notice
_CACHE_MARGIN_S = 1e-3  # a slot lookup is kept for times this far inside the slot (SlotCapacity.locate)
_EXACT = 2.0**52  # whole numbers below it add and subtract exactly
_SNAP_S = 1e-6  # a trace time read back within this of a whole millisecond is that millisecond


@dataclass(slots=True)
class Grant:
    """One node a launch got: its identity in the pool and when the market takes it back."""

    key: Hashable  # (not ``object``: mypyc's dataclasses cannot name a builtin, spotrelay/sim_native.py)
    removal_t: float  # absolute simulated seconds; inf = never


class TraceCapacity:
    """``semantics="capacity"`` (default): the trace's live count is what the pool offers a customer;
    a drop below what the job holds reclaims the difference (free capacity goes first, as EC2 takes
    back unused capacity before running instances). ``"nodes"``: the job's nodes are trace nodes
    and live exactly as long (pessimistic: every removal can hit the job, whatever it holds)."""

    def __init__(self, trace: Trace, offset_s: float, semantics: str = "capacity") -> None:
        self.trace, self.offset, self.semantics = trace, offset_s, semantics
        self.period = trace.period_s
        self.adds = [n.add_s for n in trace.nodes]
        self.removes = [n.remove_s for n in trace.nodes]
        self.drops = sorted({r for r in self.removes})
        events = sorted([(a, 1) for a in self.adds] + [(r, -1) for r in self.removes])
        live = peak = 0
        for _, d in events:
            live += d
            peak = max(peak, live)
        self.peak = peak  # the most the pool ever offers
        # capacity(t) by two bisections: every node removed by tau was added by then (traces run forward)
        self._sorted_removes = sorted(self.removes)
        self._forward = all(r >= a for a, r in zip(self.adds, self.removes, strict=True)) and self.adds == sorted(
            self.adds)

    def _tau(self, t: float) -> tuple[int, float]:
        """(cycle, time into the trace's period) of ``t``. The trace's times are whole milliseconds, and
        ``t + offset - cycle * period`` lands a few 1e-10 s off them (a removal's own time read back
        as just before it): within a microsecond of a millisecond, tau is that millisecond. Before,
        a node removed "now" still looked alive, a launch got it with a reclaim at ``t`` itself and a
        policy that relaunches at once never moved the clock again."""
        x = t + self.offset
        cycle = int(x // self.period)
        tau = x - cycle * self.period
        ms = round(tau * 1000.0) / 1000.0
        if abs(tau - ms) < _SNAP_S:
            tau = ms
            if tau >= self.period:
                cycle, tau = cycle + 1, tau - self.period
        return cycle, tau

    def next_drop(self, t: float) -> float:
        """The next time after ``t`` when the trace removes nodes (absolute seconds)."""
        _, tau = self._tau(t)
        i = bisect.bisect_right(self.drops, tau)
        if i < len(self.drops):
            return t + self.drops[i] - tau
        return t + self.period - tau + self.drops[0]

    def _alive(self, t: float) -> tuple[int, float, list[int]]:
        cycle, tau = self._tau(t)
        upto = bisect.bisect_right(self.adds, tau)
        return cycle, tau, [i for i in range(upto) if self.removes[i] > tau]

    def capacity(self, t: float) -> int:
        if not self._forward:
            return len(self._alive(t)[2])
        _, tau = self._tau(t)
        return bisect.bisect_right(self.adds, tau) - bisect.bisect_right(self._sorted_removes, tau)

    def offered(self, t: float) -> int:
        """What a launch can get now: the live count, less what EC2 reclaims within the notice window
        (it sends notices because it needs that capacity back; it does not hand it out meanwhile)."""
        cap, d = self.capacity(t), self.next_drop(t)
        while d <= t + NOTICE_S:
            cap = min(cap, self.capacity(d))
            d = self.next_drop(d + 5e-4)
        return cap

    def grant(self, t: float, count: int, held: set[object], rng: random.Random) -> list[Grant] | None:
        if self.semantics == "capacity":
            if self.offered(t) - len(held) < count:
                return None
            return [Grant(("cap", rng.random()), float("inf")) for _ in range(count)]
        cycle, tau, alive = self._alive(t)
        free = [i for i in alive if (cycle, i) not in held]
        if len(free) < count:
            return None
        picked = rng.sample(free, count)
        return [Grant((cycle, i), t + self.removes[i] - tau) for i in picked]


class SlotCapacity:
    def __init__(self, slots: list[Slot], period_s: float, derived_score: bool = False) -> None:
        self.slots, self.period = slots, period_s
        self.derived_score = derived_score  # the slots' score is the generator's, not a recorded one
        self.starts = [s.start_s for s in slots]
        self._serial = 0
        # the last lookup: (lo, hi, cycle, bisect index, next start); any t in [lo, hi) has the same.
        # hi sits _CACHE_MARGIN_S inside the slot (t - base may round up to the next start); lo is the
        # slot's start where that sum is exact (whole seconds: t >= base + start then gives
        # t - base >= start), else _CACHE_MARGIN_S inside too: rounding never moves a cached answer
        self._last = (1.0, 0.0, 0, 0, 0.0)

    def locate(self, t: float) -> tuple[int, int, float]:
        """(cycle, ``bisect_right(starts, t - cycle * period)``, the slot's end) for ``t``: what
        ``slot_at`` and ``next_start`` compute, kept for the slot last looked up (prices and quotes
        are read ~100k times a job-month, mostly in the slot just read)."""
        last = self._last
        if last[0] <= t < last[1]:
            return last[2], last[3], last[4]
        cycle = int(t // self.period)
        base = cycle * self.period
        i = bisect.bisect_right(self.starts, t - base)
        end = base + self.starts[i] if i < len(self.starts) else base + self.period + self.starts[0]
        start = self.starts[i - 1] if i > 0 else 0.0
        lo = base + start
        if not (float(lo).is_integer() and float(start).is_integer() and abs(lo) < _EXACT):  # else rounding may blur it
            lo += _CACHE_MARGIN_S
        hi = base + (self.starts[i] if i < len(self.starts) else self.period) - _CACHE_MARGIN_S
        if lo <= t < hi:
            self._last = (lo, hi, cycle, i, end)
        return cycle, i, end

    def slot_at(self, t: float) -> tuple[int, Slot]:
        cycle, i, _ = self.locate(t)
        return cycle, self.slots[max(0, i - 1)]

    def capacity(self, t: float) -> int | None:
        return self.slot_at(t)[1].capacity

    def offered(self, t: float) -> int | None:
        """What a launch can get now (None: no limit): the lowest capacity of this slot and of those
        that start within the notice window (EC2 has sent the notices for what they take back because
        it needs that capacity; it does not hand it out meanwhile: ``TraceCapacity.offered``)."""
        cycle, i, start = self.locate(t)  # (the next slot's start)
        cap = self.slots[max(0, i - 1)].capacity
        n = len(self.slots)
        j = i
        while start - t <= NOTICE_S and j - i <= n:  # (slots shorter than the window: each one in it)
            following = self.slots[j % n].capacity
            if following is not None and (cap is None or following < cap):
                cap = following
            j += 1
            start = (cycle + j // n) * self.period + self.starts[j % n]
        return cap

    def next_start(self, t: float) -> float:
        """When the slot holding ``t`` ends (absolute seconds)."""
        return self.locate(t)[2]

    @property
    def peak(self) -> float:
        caps = [s.capacity for s in self.slots]
        return float("inf") if any(c is None for c in caps) else float(max(c for c in caps if c is not None))

    def grant(self, t: float, count: int, held: set[object], rng: random.Random,
              default_rate: float = 0.0) -> list[Grant] | None:
        _, slot = self.slot_at(t)
        offered = self.offered(t)
        if offered is not None and offered - len(held) < count:
            return None
        rate = slot.interruptions_per_hour if slot.interruptions_per_hour is not None else default_rate
        squeeze = self._squeeze(t, len(held) + count)
        out: list[Grant] = []
        for n in range(count):
            life = rng.expovariate(rate / 3600.0) if rate > 0 else float("inf")
            end = t + life
            if squeeze is not None and n >= count - squeeze[1]:
                end = min(end, squeeze[0])  # the newest nodes go first when the slot shrinks
            self._serial += 1
            out.append(Grant(("slot", self._serial), end))
        return out

    def _squeeze(self, t: float, holding: int) -> tuple[float, int] | None:
        """(when, how many) the first later slot (within one period) takes back from ``holding``."""
        cycle = int(t // self.period)
        base = cycle * self.period
        i = bisect.bisect_right(self.starts, t - base)
        for k in range(len(self.slots)):
            j = i + k
            start = base + (j // len(self.slots)) * self.period + self.starts[j % len(self.slots)]
            cap = self.slots[j % len(self.slots)].capacity
            if cap is not None and cap < holding:
                return start, holding - cap
        return None


@dataclass(slots=True)
class SimPool:
    pool: Pool
    key: str
    on_demand_price: float
    spot_price: float | None  # constant spot price (trace/synthetic); None for on-demand
    band: int | None
    gpus: int
    capacity: TraceCapacity | SlotCapacity | None = None  # None: unlimited, never reclaimed
    default_rate: float = 0.0  # reclaims per instance-hour when a slot gives none
    score: float | None = None  # spot placement score when no slot gives one

    @property
    def spot(self) -> bool:
        return self.pool.market == "spot"

    def price(self, t: float) -> float:
        if isinstance(self.capacity, SlotCapacity):
            return self.capacity.slot_at(t)[1].spot_price
        return self.on_demand_price if self.spot_price is None else self.spot_price

    def price_until(self, t: float) -> float:
        """``price(t)`` holds at least until then (a slot's end; never changes otherwise)."""
        return self.capacity.next_start(t) if isinstance(self.capacity, SlotCapacity) else float("inf")

    def price_span(self, t: float) -> tuple[float, float]:
        """``(price(t), price_until(t))`` in one slot lookup."""
        cap = self.capacity
        if isinstance(cap, SlotCapacity):
            _, i, end = cap.locate(t)
            return cap.slots[max(0, i - 1)].spot_price, end
        return (self.on_demand_price if self.spot_price is None else self.spot_price), float("inf")

    def price_history(self, start: float, end: float) -> list[tuple[float, float]]:
        """``MarketData.price_history``: (t, price) at ``start`` and at each slot start up to ``end``
        (a trace's or a fixed price: one), the slots ``billing.slot_bills`` bills a node by."""
        out, t = [], start
        while True:
            price, until = self.price_span(t)
            out.append((t, price))
            if until >= end or until <= t:
                return out
            t = until

    def placement_score(self, t: float, count: int = 0, held: int = 0, seed: int = 0,
                        derive: bool = True) -> float | None:
        """The recorded score (a pools CSV's), else with ``derive`` one sized for ``count`` nodes
        from the capacity now (``held`` of it already the job's), else the pool's fixed one."""
        if isinstance(self.capacity, SlotCapacity):
            slot = self.capacity.slot_at(t)[1]
            if slot.placement_score is not None and not (derive and self.capacity.derived_score):
                return slot.placement_score
            offered = self.capacity.offered(t)
            if derive and count and offered is not None:
                return gang_score(offered - held, count, seed, self.key, t)
            return slot.placement_score
        if derive and count and isinstance(self.capacity, TraceCapacity):
            cap = self.capacity
            return gang_score((cap.offered(t) if cap.semantics == "capacity" else cap.capacity(t)) - held, count,
                              seed, self.key, t)
        return self.score

    def quote_key(self, t: float, capacity: int, held: int) -> tuple[object, ...] | None:
        """What this pool's quote at ``t`` (for ``capacity`` nodes, ``held`` of them the job's) is a function
        of, or None where it must be computed (a trace's capacity moves with every trace event): a slot
        pool's (slot, noise window, count, held, what it offers: ``SlotCapacity.offered``, lower inside a
        notice window), the same slot index as ``slot_at`` finds; a pool without
        a capacity model always quotes the same."""
        cap = self.capacity
        if cap is None:
            return (self.key,)
        if isinstance(cap, SlotCapacity):
            cycle, i, _ = cap.locate(t)
            return (self.key, cycle, i, int(t // SCORE_WINDOW_S), capacity, held, cap.offered(t))
        return None


@dataclass
class Market:
    pools: list[SimPool]
    unannounced_share: float = 0.1
    rebalance_share: float = 0.5
    boot_s: float = 300.0
    boot_spread: float = 0.15  # each node boots in its type's mean x U(1 - spread, 1 + spread)
    boot_by_type: dict[str, float] = field(default_factory=dict)  # instance type -> mean boot (else boot_s)
    seed: int = 0  # draws the derived placement scores' noise
    gang_scores: bool = True  # placement scores sized for the launch where capacity is known
    _static_quotes: list[PoolQuote] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.by_key = {p.key: p for p in self.pools}
        self._varies = any(isinstance(p.capacity, SlotCapacity) for p in self.pools)
        self.book = QuoteBook()  # the quotes made so far (sim/quotes.py)

    def boot_mean(self, instance_type: str) -> float:
        """Seconds from launch to NodeReady an ``instance_type`` node takes on average (a p5 attaches
        32 EFA interfaces, a p4d 4: recovery/boot.py's table is the product's own estimate)."""
        return self.boot_by_type.get(instance_type, self.boot_s)

    def expected_boot_s(self, pool: Pool) -> float:
        """``Compute.expected_boot_s`` of the simulated compute: the boot model's mean for the pool's
        type (each node boots in it x U(1 - spread, 1 + spread)); a move's old gang saves by then
        (services/migrate.py)."""
        return self.boot_mean(pool.instance_type)

    def quotes(self, t: float, capacity: int = 0, held: dict[str, int] | None = None) -> list[PoolQuote]:
        """What the MarketData port would answer now for a launch of ``capacity`` nodes (0: scores
        unsized); ``held``: nodes of the job per pool key. Cached while nothing in it can move."""
        sized = self.gang_scores and capacity > 0
        if not self._varies and not sized and self._static_quotes is not None:
            return self._static_quotes
        held = held or {}
        out = [self.quote(p, t, capacity, held.get(p.key, 0)) for p in self.pools]
        if not self._varies and not sized:
            self._static_quotes = out
        return out

    def quote(self, p: SimPool, t: float, capacity: int = 0, held: int = 0) -> PoolQuote:
        """One pool's quote in ``quotes(t, capacity, ...)`` (``held``: the job's nodes there), made once
        and looked up after (sim/quotes.py)."""
        return self.book.quote(self, p, t, capacity, held)

    def grant(self, sp: SimPool, t: float, count: int, held: set[object], rng: random.Random) -> list[Grant] | None:
        """The nodes a gang launch gets, or None for InsufficientInstanceCapacity."""
        if sp.capacity is None:
            return [Grant(("od", rng.random()), float("inf")) for _ in range(count)]
        if isinstance(sp.capacity, SlotCapacity):
            return sp.capacity.grant(t, count, held, rng, sp.default_rate)
        return sp.capacity.grant(t, count, held, rng)


def from_quotes(quotes: list[PoolQuote], on_demand: dict[tuple[str, str], float], boot_s: float) -> Market:
    """A market of fixed quotes with unlimited capacity (the twin's ``MarketModel``, scripted faults)."""
    pools = []
    for q in quotes:
        info = catalog.instance(q.pool.instance_type)
        od = on_demand.get((q.pool.region, q.pool.instance_type), q.price_per_hour)
        pools.append(SimPool(pool=q.pool, key=q.pool.key, on_demand_price=od,
                             spot_price=q.price_per_hour if q.pool.market == "spot" else None,
                             band=q.advisor_band, gpus=info.gpus if info else 8, score=q.placement_score))
    return Market(pools=pools, unannounced_share=0.0, rebalance_share=0.0, boot_s=boot_s, boot_spread=0.0)


def pool_glob_matches(key: str, pattern: str) -> bool:
    """``--trace POOL=FILE``'s POOL against a pool key (its ``/spot`` may be left out)."""
    return fnmatch.fnmatch(key, pattern) or fnmatch.fnmatch(key, pattern + "/spot")


def match_trace(key: str, mapping: list[tuple[str, Trace]], default: Trace | None) -> Trace | None:
    for pattern, trace in mapping:
        if pool_glob_matches(key, pattern):
            return trace
    return default


def slot_pools(tables: list[PoolTable]) -> dict[tuple[str, str, str], SlotCapacity]:
    out = {}
    for table in tables:
        starts = [s.start_s for s in table.slots]
        step = (starts[-1] - starts[-2]) if len(starts) > 1 else 3600.0
        out[(table.region, table.az, table.instance_type)] = SlotCapacity(table.slots, starts[-1] + step)
    return out
