"""The quotes a simulated placement review has to see: a shortlist that provably holds the pool the
shipped review (``placement.review.better_placement``) would pick from every quote, so it decides the
same for a fraction of the CPU.

Why: a review every 30 minutes of every job-month, each ranking ~36 pools and drawing a derived
placement score (a seeded noise draw) for every spot pool, was most of the simulator's CPU.

How: a pool's score can only fall as its placement score rises (the capacity risk falls with it; the
other terms are fixed by the price and the pool's stats record), so its score with a placement score
of 10 bounds its exact score from below, for every gang size. Pools are walked by that bound, lowest
first. A pool that is not cooling down gets its exact quote, and its exact scores at the gang sizes
``placement.policy._why_not`` lets through (but the current pool's at or under the running size:
better_placement never picks those) lower the best seen. The walk
stops at the first pool whose bound is above the best exact score seen: it, and every pool after it,
ranks behind that candidate (a bound equal to the best is still visited: it could win a tie on size
or key). The best starts at the current placement's own score (``better_placement`` moves only to
a candidate that scores lower, and its ``_observed`` only raises a candidate's score): when no
candidate beats it, every quote and the shortlist both answer stay. better_placement then runs,
unchanged, on the shortlist plus the current pool's quote; the
ranking's order does not depend on the order of the quotes. Bounds and their order are kept while
each pool's price (until its slot ends) and stats record (the same object: records are replaced,
never changed) stay; a new price (every slot of a synthetic market) costs no scoring: ``score_pool`` is
affine in the price, so the bound follows from the pool's scores at prices 0 and 1 (kept per record),
lowered by a relative 1e-9 so float rounding can only make the walk look further.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

from spotrelay.placement.cooldown import CooldownPolicy, PoolEvent
from spotrelay.placement.gang_fit import SizedScores
from spotrelay.placement.policy import _why_not, score_pool
from spotrelay.placement.pool_stats import InMemoryPoolStatsStore, PoolStats
from spotrelay.placement.review import Move, better_placement
from spotrelay.ports.market import PoolQuote

if TYPE_CHECKING:
    from spotrelay.sim.controller import SpotrelayRun

BEST_SCORE = 10.0  # the highest spot placement score: the lowest capacity risk
_MARGIN_S = 1e-3  # a price is looked at again this long before its slot ends (float rounding)
_LOWER = 1.0 - 1e-9  # a bound computed from the affine form is lowered this much (float rounding)
_RESORT = 4  # a refresh of more pools than this sorts the walk order once instead of one bisect per pool


@dataclass(slots=True)
class Bound:
    price: float
    stats: PoolStats | None
    sizes: tuple[int, ...]  # the gang sizes it is scored at (largest first)
    low: float  # a lower bound of its score at every one of them
    until: float  # the price holds until then


class SimPoolStats(InMemoryPoolStatsStore):
    """The run's pool stats store; it also notes which pools' records changed (for the bounds)."""

    def __init__(self, policy: CooldownPolicy | None = None) -> None:
        super().__init__(policy)
        self.changed: set[str] = set()

    def record(self, pool_key: str, event: PoolEvent, now: float, hours: float = 0.0) -> PoolStats:
        self.changed.add(pool_key)
        return super().record(pool_key, event, now, hours)

    def view(self) -> Mapping[str, PoolStats]:
        """Every record, read-only and live (``get_many`` of every pool without the copy)."""
        return MappingProxyType(self._items)


@dataclass
class Shortlist:
    """One run's bounds, by pool key, and the walk order (bound, key) they give."""

    bounds: dict[str, Bound] = field(default_factory=dict)
    order: list[tuple[float, str]] = field(default_factory=list)
    until: float = -1.0  # every price holds until then
    # pool key -> (the record they were scored with, the gang sizes, [(score at price 0, score per USD/h)]
    # per size)
    units: dict[str, tuple[PoolStats | None, tuple[int, ...], list[tuple[float, float]]]] = field(
        default_factory=dict)
    probes: dict[str, tuple[PoolQuote, ...]] = field(default_factory=dict)  # pool key -> its quotes at prices 0, 1
    # (pool key, id of a quote) -> (that quote: its id stays its own, record, exclusions, (current,
    # world, sized scores), the candidate sizes' exact scores)
    scored: dict[tuple[str, int], tuple[PoolQuote, PoolStats | None, frozenset[str],
                                        tuple[bool, int, SizedScores | None], list[float]]] = field(
        default_factory=dict)


def _unit(run: SpotrelayRun, key: str, stats: PoolStats | None) -> tuple[PoolStats | None, tuple[int, ...],
                                                                      list[tuple[float, float]]]:
    """The pool's scores at prices 0 and 1 per gang size with ``stats``: ``score_pool`` is affine in the
    price (the gang's price is its only price term), so they give every price's; kept while the record
    stays (slot prices move every slot)."""
    memo, spec, sp = run.shortlist, run.spec, run.market.by_key[key]
    res = spec.resources
    probes = memo.probes.get(key)
    if probes is None:  # (a pool's two probe quotes: its records change with every notice there)
        probes = memo.probes[key] = tuple(PoolQuote(
            pool=sp.pool, price_per_hour=p, advisor_band=sp.band if sp.spot else None,
            placement_score=BEST_SCORE if sp.spot else None) for p in (0.0, 1.0))
    sizes = tuple(range(res.nodes, res.smallest_gang - 1, -1))
    at = [score_pool(spec, q, stats, run.config, nodes=n).score for n in sizes for q in probes]
    unit = memo.units[key] = (stats, sizes, [(at[2 * i], at[2 * i + 1] - at[2 * i]) for i in range(len(sizes))])
    return unit


def _bound(run: SpotrelayRun, key: str, stats: PoolStats | None, order: bool = True) -> None:
    """(Re)compute one pool's bound if its price or record changed, and keep the order sorted (``order``;
    else the caller sorts it once). A slot's new price (every spot pool's, each slot of a synthetic
    market) updates the bound in place."""
    memo = run.shortlist
    price, until = run.market.by_key[key].price_span(run.now)
    price, until = round(price, 4), until - _MARGIN_S
    if until < memo.until:
        memo.until = until
    old = memo.bounds.get(key)
    if old is not None and old.stats is stats and old.price == price:
        old.until = until
        return
    unit = memo.units.get(key)
    if unit is None or unit[0] is not stats:
        unit = _unit(run, key, stats)
    # lowered by a relative 1e-9 against float rounding: a lower bound only makes the walk look further
    # (the lowest of the lowered scores: rounding a product by a positive factor keeps the order; a fixed
    # gang has one size, the common case, taken without a generator on this per-slot path)
    terms = unit[2]
    low = (terms[0][0] + terms[0][1] * price if len(terms) == 1
           else min(fixed + per_usd * price for fixed, per_usd in terms)) * _LOWER
    if old is None:
        memo.bounds[key] = Bound(price, stats, unit[1], low, until)
        if order:
            bisect.insort(memo.order, (low, key))
        return
    if order:
        del memo.order[bisect.bisect_left(memo.order, (old.low, key))]
        bisect.insort(memo.order, (low, key))
    old.price, old.stats, old.sizes, old.low, old.until = price, stats, unit[1], low, until


def _refresh(run: SpotrelayRun, stats: Mapping[str, PoolStats]) -> Shortlist:
    """Bounds for the pools whose record changed since the last review; every pool's once a price may have."""
    memo, store, now = run.shortlist, run.stats, run.now
    keys: set[str] | list[str] = store.changed
    if now >= memo.until:  # the pools whose price may have moved (on-demand and trace prices never do)
        keys = [sp.key for sp in run.market.pools if sp.key in store.changed or sp.key not in memo.bounds
                or now >= memo.bounds[sp.key].until]
    many = len(keys) > _RESORT  # (a new slot of a synthetic market moves every spot pool's price)
    for key in keys:
        _bound(run, key, stats.get(key), not many)
    if many:  # the same list as one bisect per pool would leave: (bound, key) pairs are unique
        memo.order = sorted((b.low, k) for k, b in memo.bounds.items())
    if now >= memo.until:
        memo.until = min(b.until for b in memo.bounds.values())
    store.changed = set()
    return memo


def review_quotes(run: SpotrelayRun, here: PoolQuote, world: int, stats: Mapping[str, PoolStats],
                  excluded: frozenset[str], sized: SizedScores | None = None) -> list[PoolQuote]:
    """``here`` (the current pool's quote, gang of ``world``) and every quote that may hold the best
    candidate of ``better_placement`` over all of ``run.market``'s quotes."""
    spec, config, now, market = run.spec, run.config, run.now, run.market
    res = spec.resources
    count = res.nodes + res.spares
    memo = _refresh(run, stats)
    here_key = here.pool.key
    # better_placement stays unless its best candidate scores below the current placement (its
    # _observed only raises a score): the walk need not look past that either
    best = score_pool(spec, here, stats.get(here_key), config, nodes=world).score
    out = [here]
    for low, key in memo.order:
        if low > best:
            break
        b = memo.bounds[key]
        st = b.stats
        if st is not None and st.cooling(now):
            continue  # _why_not drops a cooling pool (no survivors run in a review's candidates)
        current = key == here_key
        exact = here if current else market.quote(market.by_key[key], now, count, len(run.held.get(key, ())))
        seen = memo.scored.get((key, id(exact)))
        if seen is None or seen[0] is not exact or seen[1] is not st or seen[2] != excluded or seen[3] != (
                current, world, sized):
            # the scores of the sizes _why_not lets through; kept per quote object (a pool's quotes
            # repeat: whole-number scores) while the record and exclusions stay (_why_not reads the
            # clock only for the cooldown, and cooling pools were skipped)
            scores = [score_pool(spec, exact, st, config, nodes=n).score for n in b.sizes
                      if not (current and n <= world)
                      and _why_not(spec, exact, st, now, excluded, None, frozenset(), n, config, sized) is None]
            if len(memo.scored) > 50_000:
                memo.scored.clear()
            seen = memo.scored[(key, id(exact))] = (exact, st, excluded, (current, world, sized), scores)
        if seen[4]:
            best = min(best, *seen[4])
            if not current:  # (a quote dropped at every size adds nothing to the ranking)
                out.append(exact)
    return out


def recovery_quotes(run: SpotrelayRun, stats: Mapping[str, PoolStats], excluded: frozenset[str]) -> list[PoolQuote]:
    """The quotes the recovery strategies need to decide as from every quote: the quote of every pool
    the gang has nodes in (the survivors' pool is scored with ``running``, whatever its cooldown or
    gang fit), and every quote that may hold the best candidate of ``evaluate_pools``/``best_pool``
    for the whole gang among the other pools (only those lower the best seen: whether the survivors'
    pool passes depends on ``running``, which ``best_pool`` does not pass)."""
    spec, config, now, market = run.spec, run.config, run.now, run.market
    res = spec.resources
    count = res.nodes + res.spares
    keep = {n.pool.key for n in run.gang.values()}
    memo = _refresh(run, stats)
    best = float("inf")
    out = [market.quote(market.by_key[key], now, count, len(run.held.get(key, ()))) for key in sorted(keep)
           if key in market.by_key]
    for low, key in memo.order:
        if low > best:
            break
        st = memo.bounds[key].stats
        if key in keep or (st is not None and st.cooling(now)):
            continue  # (_why_not drops a cooling pool that runs no survivors)
        q = market.quote(market.by_key[key], now, count, len(run.held.get(key, ())))
        if _why_not(spec, q, st, now, excluded, None, frozenset(), res.nodes, config) is None:
            best = min(best, score_pool(spec, q, st, config).score)
            out.append(q)
    return out


def plan_quotes(run: SpotrelayRun, held: Mapping[str, int], stats: Mapping[str, PoolStats], excluded: frozenset[str],
                first: int, sized: SizedScores | None = None,
                saving: Mapping[str, bool] | None = None) -> list[PoolQuote] | None:
    """Quotes that hold Plan's first ``first`` candidates of a new gang as from every quote, or None
    (rank every quote); ``held``: the job's nodes per pool when Plan asked. Plan offers each pool once
    at its best size before any pool again, so when ``first`` pools pass, its candidates are the
    ``first`` pools with the lowest best scores: the walk stops at a bound above the ``first``-th
    lowest best score seen. ``saving`` (pool key -> ``spot_wait`` says it saves; while the job may wait
    for spot): Plan then offers only those, so the walk looks only at them. With fewer than ``first``
    passing the walk saw every pool that can, and Plan's candidates are those: it launches on the best
    (a saving one needs no wait) without reading another quote. None when none passes (Plan would wait,
    or try the excluded again: reading every quote)."""
    spec, config, now, market = run.spec, run.config, run.now, run.market
    res = spec.resources
    count = res.nodes + res.spares
    memo = _refresh(run, stats)
    bests: list[float] = []  # each passing pool's best score, sorted
    out: list[PoolQuote] = []
    for low, key in memo.order:
        if len(bests) >= first and low > bests[first - 1]:
            break
        b = memo.bounds[key]
        st = b.stats
        if (st is not None and st.cooling(now)) or (saving is not None and not saving.get(key)):
            continue  # (_why_not drops a cooling pool: no survivors run in a new gang's candidates)
        q = market.quote(market.by_key[key], now, count, held.get(key, 0))
        scores = [score_pool(spec, q, st, config, nodes=n).score for n in b.sizes
                  if _why_not(spec, q, st, now, excluded, None, frozenset(), n, config, sized) is None]
        if scores:
            bisect.insort(bests, min(scores))
            out.append(q)
    # a walk stops early only once ``first`` pools passed: with fewer, it saw every pool that can pass,
    # so ``out`` holds all of Plan's candidates (on a stormy market a gang fits a few pools: the usual case)
    return out if bests else None


def same_review(run: SpotrelayRun, here: PoolQuote, world: int, quotes: list[PoolQuote],
                stats: Mapping[str, PoolStats], excluded: frozenset[str], spot_hours: float | None,
                sized: SizedScores | None = None, stint_hours: float | None = None) -> Move | None:
    """``better_placement`` over ``quotes``, or its last answer when none of what it reads changed:
    the same quote and stats objects (both are replaced, never changed), the same cooling verdicts
    now, gang size, exclusions, spot hours and stint hours (``now`` reaches it only through the cooldowns)."""
    records = [stats.get(q.pool.key) for q in quotes]
    cooling = [st is not None and st.cooling(run.now) for st in records]
    last = run.last_review
    if (last is not None and last[0] is here and last[1] == world and last[4] == excluded and last[5] == spot_hours
            and last[8] == sized and last[9] == stint_hours
            and len(last[2]) == len(quotes) and all(a is b for a, b in zip(last[2], quotes, strict=False))
            and all(a is b for a, b in zip(last[3], records, strict=False)) and last[6] == cooling):
        return last[7]
    move = better_placement(run.spec, here, world, quotes, stats, run.now, excluded, config=run.config,
                            spot_hours=spot_hours, sized=sized, stint_hours=stint_hours,
                            boot_s=run.market.expected_boot_s)
    run.last_review = (here, world, quotes, records, excluded, spot_hours, cooling, move, sized, stint_hours)
    return move
