"""MarketData from EC2: live spot prices per AZ and spot placement scores; the rest from the catalog.

- Spot price: ``DescribeSpotPriceHistory`` (Linux/UNIX) from now, the newest entry per AZ and type.
- Placement score (unless the caller reads the prices alone, ``scores=False``: a review's poll):
  ``GetSpotPlacementScores`` per instance type with ``SingleAvailabilityZone``,
  sized for the launch (``TargetCapacity`` = the gang and its spares, so a pool that holds one node
  but not the gang scores low); it answers with zone IDs, mapped to this account's zone names via
  ``DescribeAvailabilityZones`` (asked once per region: the mapping is fixed). AWS caps the target
  capacity by the account's recent spot usage: a refused size is asked again at ``target_capacity``
  (1 by default). The call needs its own IAM permission and is rate limited: when it fails, scores
  are None.
- Spot Advisor band and on-demand price: the static catalog (there is no API for the band; the
  Pricing API lives in two regions only and is slow, and the table is good enough to rank pools).
- Price in effect (``price_history``): ``DescribeSpotPriceHistory`` of one pool (its AZ and type) over
  an attempt's life, which AWS answers with the change in effect at its start time too; the ledger
  counts a closed attempt at its time-weighted mean (AWS bills the price in effect). A failure
  answers [] (the launch price stands). AWS keeps 90 days of history: an attempt older than that
  counts its first days at its launch price.
- When price history fails for a region (throttled, not enabled), that region's spot quotes come
  from the fallback market (the catalog) so placement never stops for want of a price, marked
  ``fallback`` (a review's price mark is made of readings only: services/review.py).
- A region's prices read in the last ``PRICE_TTL_S`` are read again only after that: one review reads
  them for the gang and for each elastic size, and a poll that found them moved reads them again for
  the full review; DescribeSpotPriceHistory is rate-limited per account like every EC2 call, and
  its prices change hours apart.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from spotrelay.adapters.aws import client
from spotrelay.adapters.static_market import StaticMarketData
from spotrelay.domain.models import Pool
from spotrelay.placement import catalog
from spotrelay.ports.market import MarketData, PoolQuote

log = logging.getLogger(__name__)
_FAILURES = (ClientError, BotoCoreError)
_MALFORMED = (KeyError, TypeError, ValueError, AttributeError)  # an answer missing or garbling a field
PRICE_TTL_S = 60.0  # a region's price read serves the calls within this long (a failure is never kept)


class Ec2MarketData:
    def __init__(
        self, fallback: MarketData | None = None, client_factory: Callable[..., Any] = client,
        clock: Callable[[], float] = time.time, target_capacity: int = 1, placement_scores: bool = True,
    ) -> None:
        self._fallback = fallback or StaticMarketData()
        self._client = client_factory
        self._clock = clock
        self._target = target_capacity  # the smallest size a placement score is asked about
        self._use_scores = placement_scores
        self._prices: dict[tuple[str, tuple[str, ...]], tuple[float, dict[tuple[str, str], float]]] = {}
        self._zones: dict[str, dict[str, str]] = {}  # region -> zone ID -> this account's zone name

    def quotes(self, regions: list[str], instance_types: list[str], markets: list[str],
               capacity: int = 1, scores: bool = True) -> list[PoolQuote]:
        use = "spot" in markets and self._use_scores and scores
        placement = self._placement_scores(regions, instance_types, max(self._target, capacity)) if use else {}
        out: list[PoolQuote] = []
        for region in regions:
            prices = self._spot_prices(region, instance_types)
            if prices is None:
                out.extend(q.model_copy(update={"fallback": True}) if q.pool.market == "spot" else q
                           for q in self._fallback.quotes([region], instance_types, markets))
                continue
            for itype in instance_types:
                zones = sorted(az for az, t in prices if t == itype) or list(catalog.zones(region, itype))
                for az in zones:
                    if "spot" in markets and (az, itype) in prices:
                        pool = Pool(region=region, az=az, instance_type=itype, market="spot")
                        out.append(PoolQuote(
                            pool=pool, price_per_hour=prices[(az, itype)],
                            advisor_band=catalog.advisor_band(region, itype),
                            placement_score=placement.get((region, az, itype)),
                        ))
                    od = catalog.on_demand_price(region, itype)
                    if "on-demand" in markets and od is not None:
                        pool = Pool(region=region, az=az, instance_type=itype, market="on-demand")
                        out.append(PoolQuote(pool=pool, price_per_hour=od))
        return out

    def price_history(self, pool: Pool, start: float, end: float) -> list[tuple[float, float]]:
        """(epoch s, USD per instance-hour) of each change of ``pool``'s spot price from ``start`` to ``end``,
        oldest first; [] for on-demand, or when EC2 cannot be asked (the caller keeps the launch price)."""
        if pool.market != "spot":
            return []
        points: list[tuple[float, float]] = []
        try:
            pages = self._client("ec2", pool.region).get_paginator("describe_spot_price_history").paginate(
                InstanceTypes=[pool.instance_type], ProductDescriptions=["Linux/UNIX"],
                AvailabilityZone=pool.az, StartTime=datetime.fromtimestamp(start, UTC),
                EndTime=datetime.fromtimestamp(max(start, end), UTC),
            )
            for page in pages:
                for entry in page.get("SpotPriceHistory", []):
                    if entry.get("AvailabilityZone") == pool.az and entry.get("InstanceType") == pool.instance_type:
                        points.append((entry["Timestamp"].timestamp(), _price(entry)))
        except (*_FAILURES, *_MALFORMED) as exc:  # (an entry without a price: none)
            log.warning("spot price history of %s failed; the launch price stands: %s", pool.key, exc)
            return []
        return sorted(points)

    def _spot_prices(self, region: str, instance_types: list[str]) -> dict[tuple[str, str], float] | None:
        """(az, type) -> newest spot price, or None when the region cannot be asked; a read of the same
        region and types within ``PRICE_TTL_S`` answers again."""
        key, now = (region, tuple(instance_types)), self._clock()
        kept = self._prices.get(key)
        if kept is not None and 0 <= now - kept[0] < PRICE_TTL_S:
            return kept[1]
        prices = self._read_prices(region, instance_types)
        if prices is not None:
            self._prices[key] = (now, prices)
        return prices

    def _read_prices(self, region: str, instance_types: list[str]) -> dict[tuple[str, str], float] | None:
        ec2 = self._client("ec2", region)
        newest: dict[tuple[str, str], tuple[datetime, float]] = {}
        try:
            pages = ec2.get_paginator("describe_spot_price_history").paginate(
                InstanceTypes=instance_types, ProductDescriptions=["Linux/UNIX"],
                StartTime=datetime.fromtimestamp(self._clock(), UTC),
            )
            for page in pages:
                for entry in page.get("SpotPriceHistory", []):
                    key = (entry["AvailabilityZone"], entry["InstanceType"])
                    stamp, price = entry["Timestamp"], _price(entry)
                    if key not in newest or stamp > newest[key][0]:
                        newest[key] = (stamp, price)
        except (*_FAILURES, *_MALFORMED) as exc:  # a malformed answer is no reading either: the catalog's
            log.warning("spot price history failed in %s, using the catalog: %s", region, exc)
            return None
        return {key: price for key, (_, price) in newest.items()}

    def _placement_scores(self, regions: list[str], instance_types: list[str],
                          target: int) -> dict[tuple[str, str, str], float]:
        """(region, az name, type) -> score 1..10 for ``target`` instances, as the API answers."""
        out: dict[tuple[str, str, str], float] = {}
        names: dict[str, dict[str, str]] = {}
        home = self._client("ec2", regions[0]) if regions else None
        for itype in instance_types:
            answer = self._scores_for(home, itype, regions, target)
            if answer is None and target > self._target:  # above the account's score limit: ask smaller
                answer = self._scores_for(home, itype, regions, self._target)
            if answer is None:
                continue
            for item in answer.get("SpotPlacementScores", []):
                region, zone_id = item.get("Region"), item.get("AvailabilityZoneId")
                if not region or not zone_id:
                    continue
                if region not in names:
                    names[region] = self._zone_names(region)
                az = names[region].get(zone_id)
                if az:
                    out[(region, az, itype)] = float(item["Score"])
        return out

    def _scores_for(self, ec2: Any, itype: str, regions: list[str], target: int) -> dict[str, Any] | None:
        try:
            return ec2.get_spot_placement_scores(
                InstanceTypes=[itype], TargetCapacity=target, TargetCapacityUnitType="units",
                SingleAvailabilityZone=True, RegionNames=regions,
            )
        except _FAILURES as exc:
            log.info("spot placement scores unavailable for %s x %d: %s", itype, target, exc)
            return None

    def _zone_names(self, region: str) -> dict[str, str]:
        """Zone ID -> zone name in this account, asked once per region: the mapping is fixed for an
        account (a failed ask is not kept: no scores map this time, the next review asks again)."""
        kept = self._zones.get(region)
        if kept is not None:
            return kept
        try:
            zones = self._client("ec2", region).describe_availability_zones()["AvailabilityZones"]
        except _FAILURES:
            return {}
        names = self._zones[region] = {z["ZoneId"]: z["ZoneName"] for z in zones}
        return names


def _price(entry: dict[str, Any]) -> float:
    """An entry's spot price in USD per hour; ValueError unless it is a finite positive number (the
    planner divides by it and compares it, so NaN or 0 would rank a pool first or never)."""
    price = float(entry["SpotPrice"])
    if not math.isfinite(price) or price <= 0:
        raise ValueError(f"spot price {entry['SpotPrice']!r} is not a positive number")
    return price
