"""Elastic gangs in placement: (pool, gang size) pairs from nodes down to resources.min_nodes."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from spotrelay.domain.models import Pool
from spotrelay.placement import PlacementConfig, evaluate_pools, rank_pools
from spotrelay.placement.policy import _excluded, gang_key
from spotrelay.ports.market import PoolQuote
from spotrelay.spec.checks import deepspeed_problems
from spotrelay.spec.models import JobSpec
from tests.unit.test_placement_policy import NOW, make_spec, quotes_for


def test_min_nodes_defaults_to_nodes_and_cannot_exceed_it() -> None:
    assert make_spec().resources.smallest_gang == 4
    assert make_spec(min_nodes=2).resources.smallest_gang == 2
    with pytest.raises(ValidationError, match="min_nodes 5 is more than nodes 4"):
        make_spec(min_nodes=5)


def test_without_gang_sizes_only_the_full_gang_is_ranked() -> None:
    spec = make_spec(min_nodes=2)
    assert {s.nodes for s in rank_pools(spec, quotes_for(spec), {}, NOW)} == {4}


def test_pairs_cover_every_size_and_the_full_gang_wins_when_nothing_constrains_it() -> None:
    spec = make_spec(min_nodes=2)
    ranked = rank_pools(spec, quotes_for(spec), {}, NOW, gang_sizes=True)
    assert {s.nodes for s in ranked} == {2, 3, 4}
    assert ranked[0].nodes == 4
    best_full = min(s.score for s in ranked if s.nodes == 4)
    same_pool_half = next(s for s in ranked if s.nodes == 2 and s.pool == ranked[0].pool)
    assert same_pool_half.breakdown["gang_share"] == 0.5 and same_pool_half.score > best_full


def test_a_smaller_gang_wins_when_it_is_cheaper_per_useful_hour() -> None:
    # without a charge for running longer, fewer nodes mean fewer interruptions of the gang per hour
    spec = make_spec(min_nodes=2)
    ranked = rank_pools(spec, quotes_for(spec), {}, NOW, gang_sizes=True,
                        config=PlacementConfig(shrink_delay_weight=0.0))  # fmt: skip
    assert ranked[0].nodes == 2


def test_the_spec_states_how_much_wall_time_counts_against_a_smaller_gang() -> None:
    # resources.wall_time_weight overrides placement's default delay charge for this job only
    cost_only = make_spec(min_nodes=2, wall_time_weight=0.0)
    assert rank_pools(cost_only, quotes_for(cost_only), {}, NOW, gang_sizes=True)[0].nodes == 2
    as_if_waiting = make_spec(min_nodes=2, wall_time_weight=1.0)
    ranked = rank_pools(as_if_waiting, quotes_for(as_if_waiting), {}, NOW, gang_sizes=True)
    assert ranked[0].nodes == 4
    half = next(s for s in ranked if s.nodes == 2)
    assert half.breakdown["delay_factor"] == pytest.approx(2.0)  # (4 / 2) ** 1
    unstated = make_spec(min_nodes=2)  # the placement default, which a config can change
    for w in (0.0, 0.7):
        ranked = rank_pools(unstated, quotes_for(unstated), {}, NOW, gang_sizes=True,
                            config=PlacementConfig(shrink_delay_weight=w))  # fmt: skip
        assert next(s for s in ranked if s.nodes == 2).breakdown["delay_factor"] == pytest.approx(2.0**w)
    with pytest.raises(ValidationError, match="wall_time_weight"):
        make_spec(min_nodes=2, wall_time_weight=-0.1)


def test_by_default_a_half_gang_that_is_a_fifth_cheaper_per_unit_of_work_wins() -> None:
    # the default delay charge (shrink_delay_weight, chosen with bench/sim_sweep.py: docs/simulator-tuning.md)
    # lets a half gang in a pool 20% cheaper per node-hour beat the full gang elsewhere (2 ** w < 1.25);
    # at the old 0.5 the full gang won (2 ** 0.5 = 1.41)
    spec = make_spec(min_nodes=2, markets=["spot"], instance_types=["p5.48xlarge"])
    pool_a = Pool(region="us-east-1", az="us-east-1a", instance_type="p5.48xlarge", market="spot")
    pool_b = pool_a.model_copy(update={"az": "us-east-1b"})
    quotes = [PoolQuote(pool=pool_a, price_per_hour=20.0, advisor_band=1),
              PoolQuote(pool=pool_b, price_per_hour=25.0, advisor_band=1)]
    only_half_in_a = frozenset({gang_key(pool_a.key, 3)})  # pool a cannot hold 3 or 4 now
    best = rank_pools(spec, quotes, {}, NOW, only_half_in_a, gang_sizes=True)[0]
    assert (best.pool, best.nodes) == (pool_a, 2)
    old = rank_pools(spec, quotes, {}, NOW, only_half_in_a, gang_sizes=True,
                     config=PlacementConfig(shrink_delay_weight=0.5))[0]  # fmt: skip
    assert (old.pool, old.nodes) == (pool_b, 4)


def test_a_gang_that_did_not_fit_excludes_that_size_and_larger_in_its_pool_only() -> None:
    spec = make_spec(min_nodes=2)
    quotes = quotes_for(spec)
    top = rank_pools(spec, quotes, {}, NOW, gang_sizes=True)[0].pool
    ranked = rank_pools(spec, quotes, {}, NOW, frozenset({gang_key(top.key, 3)}), gang_sizes=True)
    assert {s.nodes for s in ranked if s.pool == top} == {2}
    assert {s.nodes for s in ranked if s.pool != top} == {2, 3, 4}


def test_a_quota_too_small_for_the_full_gang_leaves_smaller_ones() -> None:
    spec = make_spec(min_nodes=2, markets=["spot"], instance_types=["p5.48xlarge"])
    ranking = evaluate_pools(spec, quotes_for(spec), {}, NOW, quotas={"us-east-1/spot": 3 * 192}, gang_sizes=True)
    assert ranking.ranked and {s.nodes for s in ranking.ranked} == {2, 3}
    assert not ranking.dropped


def test_deepspeed_batch_must_divide_for_every_gang_size_down_to_min_nodes() -> None:
    def spec(batch: int, accumulation: int) -> JobSpec:
        doc = make_spec(nodes=4, min_nodes=2, gpus_per_node=8).model_dump(mode="json", exclude_none=True)
        config = {"train_batch_size": batch, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 0}
        config["gradient_accumulation_steps"] = accumulation
        doc["launcher"] = {"type": "deepspeed", "deepspeed_config": config}
        return JobSpec.model_validate(doc)

    assert deepspeed_problems(spec(192, 3)) == []  # 2, 3 and 4 nodes of 8 ranks all divide 192 / 2
    problems = dict(deepspeed_problems(spec(128, 2)))
    assert "a gang of 3 nodes cannot keep the global batch 128" in problems["resources.min_nodes"]


def test_a_pool_excluded_at_a_size_is_excluded_there_and_larger_only() -> None:
    """``pool@n`` excludes the pool at n nodes and more (the smallest such entry counts); a plain key at
    every size; other pools are untouched (placement reads the set once per set, not per pair)."""
    a, b = "us-east-1/us-east-1a/p5.48xlarge/spot", "us-east-1/us-east-1b/p5.48xlarge/spot"
    excluded = frozenset({gang_key(a, 24), gang_key(a, 16), b})
    for nodes in (8, 15, 16, 20, 24, 32):
        reference = a in excluded or any(k.startswith(a + "@") and nodes >= int(k.rsplit("@", 1)[1]) for k in excluded)
        assert _excluded(a, nodes, excluded) is reference is (nodes >= 16)
        assert _excluded(b, nodes, excluded)
        assert not _excluded("eu-west-1/eu-west-1a/p5.48xlarge/spot", nodes, excluded)
    assert not _excluded(a, 32, frozenset())
