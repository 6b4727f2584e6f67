"""The simulated market's quotes, cached: what ``Market.quotes``/``Market.quote`` answer (the MarketData
port's answer for a launch of ``capacity`` nodes) without making the same quote twice. Split from
sim/market.py, whose capacity models (traces, slots) say what a quote holds.

- A pool's quote object is reused whenever its price and score are the same again (scores are whole
  numbers), so the shortlist's caches, keyed by quote objects, hit (sim/shortlist.py).
- A slot pool's quote is a function of (slot, noise window, count, held) and a pool without a
  capacity model always quotes the same: those are looked up before anything is computed
  (``SimPool.quote_key``; quotes were a sixth of a stormy run's CPU). A trace pool's quote is made
  once per instant (its capacity moves with every trace event; Plan's shortlist walk and its full
  ranking ask for the same quotes at the same instant).
- ``LazyQuotes``: the quotes of every pool as a sequence made as it is read (recover's ``quotes_for``
  reads up to the survivors' pool).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, overload

from spotrelay.ports.market import PoolQuote

if TYPE_CHECKING:
    from spotrelay.sim.market import Market, SimPool

_LIMIT = 100_000  # entries a cache holds before it starts again (a long run's quotes seldom repeat then)


class QuoteBook:
    """One market's quote caches: (key, price, score) -> the quote object, and each pool's lookup key
    (``SimPool.quote_key``) -> its quote."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, float, float | None], PoolQuote] = {}
        self._memo: dict[tuple[object, ...], PoolQuote] = {}
        self._now: dict[tuple[str, int, int], PoolQuote] = {}  # this instant's trace quotes
        self._now_t = -1.0

    def quote(self, market: Market, p: SimPool, t: float, capacity: int, held: int) -> PoolQuote:
        """``p``'s quote at ``t`` for a launch of ``capacity`` nodes (``held`` of them the job's already)."""
        memo = p.quote_key(t, capacity, held)
        if memo is None:  # a trace pool: the same instant gives the same quote (Plan asks twice)
            if t != self._now_t:
                self._now.clear()
                self._now_t = t
            key = (p.key, capacity, held)
            found = self._now.get(key)
            if found is None:
                found = self._now[key] = self.make(market, p, t, capacity, held)
            return found
        found = self._memo.get(memo)
        if found is None:
            if len(self._memo) > _LIMIT:
                self._memo.clear()
            found = self._memo[memo] = self.make(market, p, t, capacity, held)
        return found

    def make(self, market: Market, p: SimPool, t: float, capacity: int, held: int) -> PoolQuote:
        """The quote computed from the pool's price and (derived or recorded) placement score now."""
        price = round(p.price(t), 4)
        score = (p.placement_score(t, capacity, held, market.seed, market.gang_scores and capacity > 0)
                 if p.spot else None)
        found = self._seen.get((p.key, price, score))
        if found is None:
            if len(self._seen) > _LIMIT:
                self._seen.clear()
            found = self._seen[(p.key, price, score)] = PoolQuote(  # (validating is faster than model_construct)
                pool=p.pool, price_per_hour=price, advisor_band=p.band if p.spot else None, placement_score=score)
        return found


class LazyQuotes(Sequence[PoolQuote]):
    """``Market.quotes(t, count, held)`` as a sequence whose quotes are made as they are read: recover's
    ``quotes_for`` asks for every pool's but reads until it finds the survivors' pool. The pools the job
    holds nodes in come first (a port's answer has no order; quotes of the others were made, each with
    a noise draw, only to be passed over)."""

    def __init__(self, market: Market, t: float, count: int, held: dict[str, int]) -> None:
        self.market, self.t, self.size, self.held = market, t, count, held
        pools = market.pools
        self.pools = [p for p in pools if held.get(p.key)] + [p for p in pools if not held.get(p.key)]

    def __len__(self) -> int:
        return len(self.pools)

    @overload
    def __getitem__(self, i: int) -> PoolQuote: ...

    @overload
    def __getitem__(self, i: slice) -> list[PoolQuote]: ...

    def __getitem__(self, i: int | slice) -> PoolQuote | list[PoolQuote]:
        if isinstance(i, slice):
            return [self._one(p) for p in self.pools[i]]
        return self._one(self.pools[i])

    def __iter__(self) -> Iterator[PoolQuote]:
        return (self._one(p) for p in self.pools)

    def _one(self, p: SimPool) -> PoolQuote:
        return self.market.quote(p, self.t, self.size, self.held.get(p.key, 0))
