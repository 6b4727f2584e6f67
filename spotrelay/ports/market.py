"""Market data for placement: prices, interruption signals, capacity hints."""

from __future__ import annotations

from typing import Protocol

from pydantic import BaseModel, ConfigDict

from spotrelay.domain.models import Pool


class PoolQuote(BaseModel):
    model_config = ConfigDict(extra="forbid")
    pool: Pool
    price_per_hour: float  # USD per instance-hour now
    advisor_band: int | None = None  # Spot Advisor interruption band 0 (<5%) .. 4 (>20%); None on-demand
    placement_score: float | None = None  # 1..10 spot placement score; None if unknown
    # the source could not read the market (EC2 throttled its price history): the price is its fallback's,
    # the catalog's typical one, not a reading (a placement review's price mark leaves such a read out)
    fallback: bool = False


class MarketData(Protocol):
    def quotes(self, regions: list[str], instance_types: list[str], markets: list[str],
               capacity: int = 1, scores: bool = True) -> list[PoolQuote]:
        """Every pool's quote now. ``capacity``: instances one launch will ask for (the gang and its
        spares); a placement score, where the source has one, is sized for it. ``scores`` False: the
        prices are all the caller reads (a placement review's poll), so a source that pays for its
        scores (EC2's ``GetSpotPlacementScores``, rate-limited) need not ask for them."""
        ...

    def price_history(self, pool: Pool, start: float, end: float) -> list[tuple[float, float]]:
        """The changes of ``pool``'s spot price from ``start`` to ``end`` (epoch s) as (epoch s, USD per
        instance-hour), with the one in effect at ``start``: what EC2 bills its instances
        (``domain/cost.mean_price`` averages it). [] when unknown: the ledger keeps the launch price."""
        ...
