"""The static catalog is self-consistent, and the static market quotes from it."""

from __future__ import annotations

from spotrelay.adapters.static_market import StaticMarketData
from spotrelay.placement import catalog


def test_every_priced_pair_has_a_band_zones_and_a_known_type() -> None:
    for region, itype in catalog.ON_DEMAND_USD:
        assert catalog.advisor_band(region, itype) in range(5), (region, itype)
        assert catalog.zones(region, itype), (region, itype)
        assert all(az.startswith(region) for az in catalog.zones(region, itype))
        assert catalog.instance(itype) is not None and itype in catalog.SPOT_FRACTION
    assert set(catalog.ADVISOR_BAND) == set(catalog.ON_DEMAND_USD) == set(catalog.AZS)
    for region in catalog.DEFAULT_REGIONS:
        assert catalog.offered(region, "p5.48xlarge") and catalog.offered(region, "p4d.24xlarge")


def test_instance_facts() -> None:
    p5, p4d = catalog.instance("p5.48xlarge"), catalog.instance("p4d.24xlarge")
    assert p5 is not None and p4d is not None
    assert (p5.efa_interfaces, p4d.efa_interfaces) == (32, 4)
    assert (p5.gpus, p4d.gpus, p5.vcpus, p4d.vcpus) == (8, 8, 192, 96)
    assert p4d.throughput == 1.0 < p5.throughput  # p4d is the reference
    spot = catalog.typical_spot_price("us-east-1", "p5.48xlarge")
    od = catalog.on_demand_price("us-east-1", "p5.48xlarge")
    assert spot is not None and od is not None and spot < od


def test_static_market_quotes_zones_and_overrides() -> None:
    market = StaticMarketData(spot_prices={"us-east-1/us-east-1a/p4d.24xlarge/spot": 7.5},
                              placement_scores={"us-east-1/us-east-1a/p4d.24xlarge/spot": 8.0})
    quotes = market.quotes(["us-east-1", "ap-south-1"], ["p4d.24xlarge"], ["spot", "on-demand"])
    assert {q.pool.region for q in quotes} == {"us-east-1"}  # not offered in ap-south-1 per the table
    assert len(quotes) == 2 * len(catalog.zones("us-east-1", "p4d.24xlarge"))
    pinned = next(q for q in quotes if q.pool.key == "us-east-1/us-east-1a/p4d.24xlarge/spot")
    assert (pinned.price_per_hour, pinned.placement_score, pinned.advisor_band) == (7.5, 8.0, 1)
    assert all(q.advisor_band is None for q in quotes if q.pool.market == "on-demand")
