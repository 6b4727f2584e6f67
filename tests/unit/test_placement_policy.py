"""Placement: the fallback order, region switches and on-demand fall out of the scores."""

from __future__ import annotations

from typing import Any

import pytest

from spotrelay.adapters.static_market import StaticMarketData
from spotrelay.domain.models import Pool
from spotrelay.errors import NoPlacementError
from spotrelay.placement import (
    PlacementConfig,
    PoolEvent,
    PoolStats,
    apply_event,
    best_pool,
    empty_stats,
    evaluate_pools,
    rank_pools,
)
from spotrelay.ports.market import PoolQuote
from spotrelay.spec.models import JobSpec

NOW = 1_800_000_000.0
TYPES = ["p5.48xlarge", "p4d.24xlarge"]


def make_spec(**resources: Any) -> JobSpec:
    res = {"nodes": 4, "regions": ["us-east-1"], **resources}
    extra = res.pop("dataset", None)
    doc: dict[str, Any] = {
        "version": 1, "name": "llm", "entrypoint": {"command": ["python", "train.py"]},
        "resources": res, "checkpoint": {"every_minutes": 20},
    }
    if extra:
        doc["dataset"] = extra
    return JobSpec.model_validate(doc)


def quotes_for(spec: JobSpec, **kw: Any) -> list[PoolQuote]:
    res = spec.resources
    return StaticMarketData(**kw).quotes(res.regions, res.instance_types, [m.value for m in res.markets])


def cool(stats: dict[str, PoolStats], quotes: list[PoolQuote], event: PoolEvent, **match: str) -> None:
    """Record ``event`` now for every quoted pool whose fields match."""
    for q in quotes:
        if all(getattr(q.pool, k) == v for k, v in match.items()):
            stats[q.pool.key] = apply_event(stats.get(q.pool.key) or empty_stats(q.pool.key), event, NOW)


def kind(pool: Pool) -> str:
    return f"{pool.market} {pool.instance_type}"


def test_spot_p5_then_spot_p4d_then_on_demand_as_pools_cool_down() -> None:
    spec = make_spec()
    quotes = quotes_for(spec)
    stats: dict[str, PoolStats] = {}
    seen = []
    for _ in range(3):
        top = rank_pools(spec, quotes, stats, NOW)[0]
        seen.append(kind(top.pool))
        cool(stats, quotes, PoolEvent.CAPACITY_FAILURE, market=top.pool.market,
             instance_type=top.pool.instance_type)
    assert seen == ["spot p5.48xlarge", "spot p4d.24xlarge", "on-demand p5.48xlarge"]
    # and once the cooldowns pass, spot P5 is back on top
    assert kind(rank_pools(spec, quotes, stats, NOW + 4 * 3600)[0].pool) == "spot p5.48xlarge"


def test_order_is_not_hard_coded_it_follows_prices_and_throughput() -> None:
    spec = make_spec()
    cheap_p4d = quotes_for(spec, spot_prices={"us-east-1/p4d.24xlarge": 5.0})
    assert kind(rank_pools(spec, cheap_p4d, {}, NOW)[0].pool) == "spot p4d.24xlarge"
    slow_p5 = PlacementConfig(throughput={"p5.48xlarge": 1.2})
    assert kind(rank_pools(spec, quotes_for(spec), {}, NOW, config=slow_p5)[0].pool) == "spot p4d.24xlarge"


def test_region_switch_when_a_regions_spot_pools_cool_down() -> None:
    spec = make_spec(regions=["us-east-1", "us-west-2"])
    quotes = quotes_for(spec)
    stats: dict[str, PoolStats] = {}
    assert rank_pools(spec, quotes, stats, NOW)[0].pool.region == "us-east-1"  # lower band there
    cool(stats, quotes, PoolEvent.INTERRUPTED, region="us-east-1", market="spot")
    top = rank_pools(spec, quotes, stats, NOW)[0]
    # another region's spot beats this region's on-demand
    assert (top.pool.region, kind(top.pool)) == ("us-west-2", "spot p5.48xlarge")


def test_on_demand_wins_when_spot_is_not_cheaper_per_useful_hour_by_price() -> None:
    spec = make_spec()
    # spot at the on-demand price (the cap): its interruption and capacity risk make it dearer
    quotes = quotes_for(spec, spot_prices={"us-east-1/p5.48xlarge": 55.04, "us-east-1/p4d.24xlarge": 21.96})
    top = rank_pools(spec, quotes, {}, NOW)[0]
    assert top.pool.market == "on-demand"


def test_on_demand_wins_when_observed_interruptions_eat_the_discount() -> None:
    spec = make_spec(nodes=32)
    quotes = quotes_for(spec)
    stats = {  # one reclaim every 2 instance-hours: a 32-node gang is hit every few minutes
        q.pool.key: PoolStats(pool_key=q.pool.key, interruptions=100, hours_observed=200.0, launches=10)
        for q in quotes if q.pool.market == "spot"
    }
    ranked = rank_pools(spec, quotes, stats, NOW)
    assert ranked[0].pool.market == "on-demand"
    spot = next(s for s in ranked if s.pool.market == "spot")
    assert spot.breakdown["useful_fraction"] < 0.4
    assert spot.score > ranked[0].score
    # without that history the same quotes put spot first
    assert rank_pools(spec, quotes, {}, NOW)[0].pool.market == "spot"


def test_history_blends_with_the_advisor_prior() -> None:
    spec = make_spec()
    q = next(x for x in quotes_for(spec) if x.pool.market == "spot")
    prior = rank_pools(spec, [q], {}, NOW)[0].breakdown
    calm = PoolStats(pool_key=q.pool.key, hours_observed=5000.0)
    stormy = PoolStats(pool_key=q.pool.key, interruptions=50, hours_observed=5000.0)
    calm_rate = rank_pools(spec, [q], {q.pool.key: calm}, NOW)[0].breakdown["interruption_rate"]
    stormy_rate = rank_pools(spec, [q], {q.pool.key: stormy}, NOW)[0].breakdown["interruption_rate"]
    assert calm_rate < prior["interruption_rate"] < stormy_rate
    assert stormy_rate == pytest.approx(0.01, rel=0.05)  # evidence dominates the prior


def test_data_locality_prefers_the_region_with_a_replica() -> None:
    dataset = {"uri": "s3://corpus/tokens/", "replicas": {"us-west-2": "s3://corpus-usw2/tokens/"}}
    spec = make_spec(regions=["us-east-1", "us-west-2"], instance_types=["p4d.24xlarge"], dataset=dataset)
    prices = {"us-east-1/p4d.24xlarge": 8.0, "us-west-2/p4d.24xlarge": 8.4}
    ranked = rank_pools(spec, quotes_for(spec, spot_prices=prices), {}, NOW)
    assert ranked[0].pool.region == "us-west-2"
    east = next(s for s in ranked if s.pool.region == "us-east-1")
    assert east.breakdown["locality"] < 1.0 and east.breakdown["transfer_usd_per_hour"] > 0


def test_checkpoint_locality_weighs_sending_a_stated_checkpoint_between_regions() -> None:
    """A gang away from its checkpoints' region sends every save there (and reads its restores back): a
    1.12 TB checkpoint every 20 minutes is about $67 an hour at $0.02/GB, more than a $0.40 price gap."""
    prices = {"us-east-1/p4d.24xlarge": 8.4, "us-west-2/p4d.24xlarge": 8.0}
    unstated = make_spec(regions=["us-east-1", "us-west-2"], instance_types=["p4d.24xlarge"])
    assert rank_pools(unstated, quotes_for(unstated, spot_prices=prices), {}, NOW)[0].pool.region == "us-west-2"
    doc = unstated.model_dump(mode="json", exclude_none=True)
    doc["checkpoint"].update(size_gb=1120, region="us-east-1")
    spec = JobSpec.model_validate(doc)
    ranked = rank_pools(spec, quotes_for(spec, spot_prices=prices), {}, NOW)
    assert ranked[0].pool.region == "us-east-1"
    west = next(s for s in ranked if s.pool.region == "us-west-2")
    gang_rate = west.breakdown["gang_interruptions_per_hour"]
    assert west.breakdown["checkpoint_transfer_usd_per_hour"] == pytest.approx(1120 * 0.02 * (3 + gang_rate))
    assert ranked[0].breakdown["checkpoint_transfer_usd_per_hour"] == 0.0
    # the price of a GB is the config's; at 0 the distance is free again
    free = rank_pools(spec, quotes_for(spec, spot_prices=prices), {}, NOW,
                      config=PlacementConfig(checkpoint_transfer_usd_per_gb=0.0))
    assert free[0].pool.region == "us-west-2"


@pytest.mark.parametrize(("field", "value", "says"), [
    ("size_gb", 0, "greater than 0"), ("size_gb", True, "number"), ("size_gb", float("inf"), "1000000"),
    ("region", "US East", "not an AWS region name"), ("region", "us-east-1\n", "not an AWS region name"),
])
def test_a_checkpoint_size_or_region_placement_could_not_use_is_refused(field: str, value: Any, says: str) -> None:
    doc = make_spec().model_dump(mode="json", exclude_none=True)
    doc["checkpoint"][field] = value
    with pytest.raises(ValueError, match=says):
        JobSpec.model_validate(doc)


def test_spec_limits_exclusions_and_quota_drop_pools() -> None:
    spec = make_spec(markets=["spot", "on-demand"], max_hourly_price=30.0)
    quotes = quotes_for(spec)
    p5_od = next(q.pool.key for q in quotes if kind(q.pool) == "on-demand p5.48xlarge")
    spot_p5 = [q.pool.key for q in quotes if kind(q.pool) == "spot p5.48xlarge"]
    ranking = evaluate_pools(spec, quotes, {}, NOW, excluded=frozenset(spot_p5[:1]),
                             quotas={"us-east-1/spot": 4 * 96})  # room for 4 p4d, not 4 p5
    assert "max_hourly_price" in ranking.dropped[p5_od]
    assert ranking.dropped[spot_p5[0]] == "excluded"
    assert "quota" in ranking.dropped[spot_p5[1]]
    assert kind(ranking.ranked[0].pool) == "spot p4d.24xlarge"
    only_spot = make_spec(markets=["spot"], instance_types=["p4d.24xlarge"], regions=["us-west-2"])
    assert all(s.pool.market == "spot" and s.pool.region == "us-west-2"
               for s in rank_pools(only_spot, quotes_for(spec) + quotes_for(only_spot), {}, NOW))


def test_best_pool_explains_when_nothing_is_left() -> None:
    spec = make_spec(markets=["spot"], instance_types=["p5.48xlarge"])
    quotes = quotes_for(spec)
    stats: dict[str, PoolStats] = {}
    cool(stats, quotes, PoolEvent.CAPACITY_FAILURE)
    with pytest.raises(NoPlacementError, match="cooling down"):
        best_pool(spec, quotes, stats, NOW)
    with pytest.raises(NoPlacementError, match="no pool was quoted"):
        best_pool(spec, [], stats, NOW)


def test_score_is_usd_per_useful_hour_for_the_gang() -> None:
    spec = make_spec(nodes=2, instance_types=["p4d.24xlarge"], markets=["on-demand"])
    (scored,) = rank_pools(spec, quotes_for(spec)[:1], {}, NOW)
    b = scored.breakdown
    # on-demand: only hardware losses; throughput 1.0 (the reference), local data
    assert b["gang_price_per_hour"] == pytest.approx(2 * 21.96)
    expected = b["gang_price_per_hour"] * (1 + 0.1 * b["capacity_risk"]) / b["useful_fraction"]
    assert scored.score == pytest.approx(expected)
    assert 0.999 < b["useful_fraction"] < 1.0


def test_across_four_regions_every_spot_p5_pool_precedes_spot_p4d_then_on_demand() -> None:
    spec = make_spec(regions=["us-east-1", "us-east-2", "us-west-2", "eu-west-1"])
    order = ["spot p5.48xlarge", "spot p4d.24xlarge", "on-demand p5.48xlarge", "on-demand p4d.24xlarge"]
    kinds = [order.index(kind(s.pool)) for s in rank_pools(spec, quotes_for(spec), {}, NOW)]
    assert kinds == sorted(kinds) and set(kinds) == {0, 1, 2, 3}
    assert len(kinds) == len(quotes_for(spec))  # nothing dropped: all four regions compete


def test_the_deployment_fills_the_region_of_checkpoints_in_its_jobs_bucket() -> None:
    """A team states only checkpoint.size_gb: the jobs bucket (the default s3_prefix, or a resumed job's
    prefix in it) is in the home region (services/controller.spec_of); a data bucket's is the spec's."""
    from spotrelay.placement.policy import checkpoint_home

    def spec_with(**ckpt: Any) -> JobSpec:
        doc = make_spec().model_dump(mode="json", exclude_none=True)
        doc["checkpoint"].update(ckpt)
        return JobSpec.model_validate(doc)

    assert checkpoint_home(spec_with(size_gb=10), "us-east-2", "jobs").checkpoint.region == "us-east-2"
    resumed = spec_with(size_gb=10, s3_prefix="s3://jobs/checkpoints/old-job/")
    assert checkpoint_home(resumed, "us-east-2", "jobs").checkpoint.region == "us-east-2"
    data = spec_with(size_gb=10, s3_prefix="s3://data-usw2/checkpoints/x/")
    assert checkpoint_home(data, "us-east-2", "jobs").checkpoint.region is None
    stated = spec_with(size_gb=10, region="us-west-2")
    assert checkpoint_home(stated, "us-east-2", "jobs").checkpoint.region == "us-west-2"
    assert checkpoint_home(spec_with(), "us-east-2", "jobs").checkpoint.region is None  # no size: no weighing
