"""MarketData from the static catalog only: no AWS calls.

For the simulator, tests, dry runs and as the fallback of the EC2 market adapter. Spot prices are
the catalog's typical fraction of on-demand (see ``spotrelay/placement/catalog.py`` for sources);
``spot_prices`` pins a price per pool key (or per ``region/type``) for what-if runs.
"""

from __future__ import annotations

from collections.abc import Mapping

from spotrelay.domain.models import Pool
from spotrelay.placement import catalog
from spotrelay.ports.market import PoolQuote


class StaticMarketData:
    def __init__(self, spot_prices: Mapping[str, float] | None = None,
                 placement_scores: Mapping[str, float] | None = None) -> None:
        self._spot = dict(spot_prices or {})
        self._scores = dict(placement_scores or {})

    def quotes(self, regions: list[str], instance_types: list[str], markets: list[str],
               capacity: int = 1, scores: bool = True) -> list[PoolQuote]:
        quotes = (self.quote(pool) for pool in catalog.pools(regions, instance_types, markets))
        return [q for q in quotes if q is not None]

    def price_history(self, pool: Pool, start: float, end: float) -> list[tuple[float, float]]:
        """A fixed price: the one change, in effect from before ``start``."""
        quote = self.quote(pool)
        return [] if quote is None else [(start, quote.price_per_hour)]

    def quote(self, pool: Pool) -> PoolQuote | None:
        if pool.market != "spot":
            od = catalog.on_demand_price(pool.region, pool.instance_type)
            return None if od is None else PoolQuote(pool=pool, price_per_hour=od)
        price = self._spot.get(pool.key, self._spot.get(f"{pool.region}/{pool.instance_type}"))
        if price is None:
            price = catalog.typical_spot_price(pool.region, pool.instance_type)
        if price is None:
            return None
        return PoolQuote(
            pool=pool, price_per_hour=price, advisor_band=catalog.advisor_band(pool.region, pool.instance_type),
            placement_score=self._scores.get(pool.key),
        )
