"""Recovery strategies: replace the cluster, or keep survivors and replace only lost ranks."""

from __future__ import annotations

from typing import Any

import pytest

from spotrelay.adapters.static_market import StaticMarketData
from spotrelay.domain.models import Node, NodeState, Pool
from spotrelay.errors import NoPlacementError
from spotrelay.placement import PoolEvent, PoolStats, apply_event, empty_stats
from spotrelay.recovery import (
    RecoveryContext,
    RecoveryPlan,
    classify_attempt,
    get_strategy,
    plan_recovery,
    register,
    strategy_names,
)
from spotrelay.recovery.strategies import _REGISTRY, KEEP_BACKOFF_MAX_S
from spotrelay.spec.models import JobSpec

NOW = 1_800_000_000.0
HOME = Pool(region="us-east-1", az="us-east-1c", instance_type="p5.48xlarge", market="spot")


def spec(strategy: str = "replace-lost-nodes", **res: Any) -> JobSpec:
    return JobSpec.model_validate({
        "version": 1, "name": "llm", "entrypoint": {"command": ["python", "train.py"]},
        "resources": {"nodes": 4, "regions": ["us-east-1", "us-west-2"], **res},
        "checkpoint": {"every_minutes": 20}, "recovery": {"strategy": strategy},
    })


def gang(lost: dict[int, NodeState], pool: Pool = HOME) -> list[Node]:
    return [
        Node(job_id="j", node_id=f"a1-r{r}", attempt=1, rank=r, instance_id=f"i-{r}", pool=pool,
             state=lost.get(r, NodeState.RUNNING))
        for r in range(4)
    ]


def ctx(s: JobSpec, nodes: list[Node], outcome_codes: dict[int, int] | None = None,
        stats: dict[str, PoolStats] | None = None, **kw: Any) -> RecoveryContext:
    doomed = [n.rank for n in nodes if n.state is NodeState.DOOMED]
    lost = [n.rank for n in nodes if n.state is NodeState.LOST]
    outcome = classify_attempt(outcome_codes or {}, doomed, lost)
    quotes = StaticMarketData(**kw).quotes(s.resources.regions, s.resources.instance_types,
                                           [m.value for m in s.resources.markets])
    return RecoveryContext(spec=s, outcome=outcome, nodes=nodes, quotes=quotes, stats=stats or {}, now=NOW)


def test_replace_lost_nodes_keeps_survivors_in_the_same_pool() -> None:
    plan = plan_recovery(ctx(spec(), gang({2: NodeState.LOST})))
    assert plan.action == "replace-lost" and plan.pool == HOME
    assert plan.launch_ranks == [2]
    assert plan.keep_instance_ids == ["i-0", "i-1", "i-3"] and plan.terminate_instance_ids == ["i-2"]


def test_one_stall_from_the_budget_keeps_no_spot_survivors() -> None:
    # the next stalled recovery would fail the job: its next gang is placed anew (Plan then offers
    # on-demand) instead of being bet on the spot pool that keeps losing its ranks
    last = ctx(spec(), gang({2: NodeState.LOST})).model_copy(update={"last_chance": True})
    plan = plan_recovery(last)
    assert plan.action == "new-cluster" and plan.keep_instance_ids == [] and "stalled recovery" in plan.reason
    od = Pool(region="us-east-1", az="us-east-1c", instance_type="p5.48xlarge", market="on-demand")
    on_demand = spec(markets=["on-demand"])
    kept = plan_recovery(ctx(on_demand, gang({2: NodeState.LOST}, od)).model_copy(update={"last_chance": True}))
    assert kept.action == "replace-lost" and kept.pool == od  # survivors on on-demand: not spot's doing


def test_survivors_are_not_kept_through_a_backoff() -> None:
    # a recovery that waits before its next launch (the failure streak's backoff) would bill the spot
    # survivors idle through the wait, in the pool whose losses caused it: the next gang is placed anew
    waits = ctx(spec(), gang({2: NodeState.LOST})).model_copy(update={"backoff_s": 240.0})
    plan = plan_recovery(waits)
    assert plan.action == "new-cluster" and plan.keep_instance_ids == [] and "waits 240 s" in plan.reason
    assert plan.terminate_instance_ids == ["i-0", "i-1", "i-2", "i-3"]
    for short in (0.0, KEEP_BACKOFF_MAX_S):  # none (after a notice: always), or a short streak's
        at_once = plan_recovery(ctx(spec(), gang({2: NodeState.LOST})).model_copy(update={"backoff_s": short}))
        assert at_once.action == "replace-lost" and at_once.keep_instance_ids == ["i-0", "i-1", "i-3"]
    od = Pool(region="us-east-1", az="us-east-1c", instance_type="p5.48xlarge", market="on-demand")
    kept = plan_recovery(ctx(spec(markets=["on-demand"]), gang({2: NodeState.LOST}, od)).model_copy(
        update={"backoff_s": 240.0}))
    assert kept.action == "replace-lost" and kept.pool == od  # on-demand survivors are not reclaimed


def test_a_cooldown_does_not_evict_the_survivors() -> None:
    # the notice that dooms rank 1 cools the pool down: that governs new gangs, not these survivors
    stats = {HOME.key: apply_event(empty_stats(HOME.key), PoolEvent.INTERRUPTED, NOW - 60)}
    plan = plan_recovery(ctx(spec(), gang({1: NodeState.DOOMED}), stats=stats))
    assert plan.action == "replace-lost" and plan.pool == HOME and plan.launch_ranks == [1]
    assert plan.keep_instance_ids == ["i-0", "i-2", "i-3"] and plan.terminate_instance_ids == ["i-1"]
    # the interruption still weighs in the survivors' pool's score
    calm = plan_recovery(ctx(spec(), gang({1: NodeState.DOOMED})))
    assert plan.scored is not None and calm.scored is not None and plan.scored.score > calm.scored.score


def test_replace_lost_nodes_falls_back_when_the_pool_is_excluded() -> None:
    c = ctx(spec(), gang({1: NodeState.DOOMED})).model_copy(update={"excluded": frozenset({HOME.key})})
    plan = plan_recovery(c)
    assert plan.action == "new-cluster" and plan.pool != HOME
    assert plan.launch_ranks == [0, 1, 2, 3]
    assert plan.terminate_instance_ids == ["i-0", "i-1", "i-2", "i-3"]  # the doomed one too
    assert "not usable: excluded" in plan.reason


def test_replace_lost_nodes_moves_when_another_pool_is_cheaper_per_useful_hour() -> None:
    pricey = {HOME.key: 50.0}  # the survivors' pool got expensive
    plan = plan_recovery(ctx(spec(), gang({0: NodeState.LOST}), spot_prices=pricey))
    assert plan.action == "new-cluster" and plan.pool != HOME
    assert "per useful hour" in plan.reason
    # within the margin the survivors stay
    close = {HOME.key: 22.2}
    assert plan_recovery(ctx(spec(), gang({0: NodeState.LOST}), spot_prices=close)).action == "replace-lost"


def test_user_error_restarts_in_place_or_on_a_new_cluster_per_strategy() -> None:
    nodes = gang({})
    in_place = plan_recovery(ctx(spec(), nodes, {0: 1, 1: 77, 2: 77, 3: 77}))
    assert in_place.action == "restart-in-place" and in_place.launch_ranks == []
    assert len(in_place.keep_instance_ids) == 4
    fresh = plan_recovery(ctx(spec("replace-cluster"), nodes, {0: 1}))
    assert fresh.action == "new-cluster" and len(fresh.terminate_instance_ids) == 4


def test_an_infra_error_replaces_the_suspect_rank_and_releases_its_node() -> None:
    nodes = gang({3: NodeState.TERMINATED})
    plan = plan_recovery(ctx(spec(), nodes, {0: 0, 1: 77, 2: 0}))
    assert plan.action == "replace-lost" and plan.launch_ranks == [1, 3]
    assert plan.keep_instance_ids == ["i-0", "i-2"] and plan.terminate_instance_ids == ["i-1"]


def test_replace_cluster_picks_the_best_pool_and_raises_when_none_is_left() -> None:
    s = spec("replace-cluster")
    plan = plan_recovery(ctx(s, gang({3: NodeState.DOOMED})))
    assert (plan.pool.market, plan.pool.instance_type) == ("spot", "p5.48xlarge")
    assert plan.scored is not None and plan.scored.pool == plan.pool
    c = ctx(spec("replace-cluster", markets=["spot"]), gang({3: NodeState.DOOMED}))
    everything = frozenset(q.pool.key for q in c.quotes)
    with pytest.raises(NoPlacementError):
        plan_recovery(c.model_copy(update={"excluded": everything}))


def test_registry() -> None:
    assert {"replace-cluster", "replace-lost-nodes"} <= set(strategy_names())
    with pytest.raises(ValueError, match="unknown recovery strategy"):
        get_strategy("pray")

    @register("test-noop")
    class Noop:
        name: str

        def plan(self, ctx: RecoveryContext) -> RecoveryPlan:
            return RecoveryPlan(strategy=self.name, action="restart-in-place", pool=HOME, launch_ranks=[],
                                keep_instance_ids=[], terminate_instance_ids=[], reason="noop")

    try:
        assert get_strategy("test-noop").plan(ctx(spec(), gang({}), {0: 1})).strategy == "test-noop"
        with pytest.raises(ValueError, match="twice"):
            register("test-noop")(Noop)
    finally:
        _REGISTRY.pop("test-noop", None)


def test_a_rank_that_finished_is_not_kept_its_agent_has_left() -> None:
    """A notice raced the job's end: rank 1 was doomed, the others finished (exit 0) and their agents
    left. Keeping them made the next gang wait for a rank 0 that never registered, each attempt
    until the recoveries were spent (the e2e health test failed so under load)."""
    nodes = gang({1: NodeState.DOOMED})
    done = [n.model_copy(update={"state": NodeState.EXITED, "exit_code": 0}) if n.rank in (0, 2) else n for n in nodes]
    plan = plan_recovery(ctx(spec(), done))
    assert plan.action == "replace-lost" and plan.keep_instance_ids == ["i-3"] and plan.launch_ranks == [0, 1, 2]
    saved = [n.model_copy(update={"state": NodeState.EXITED, "exit_code": 75}) if n.rank != 1 else n for n in nodes]
    assert plan_recovery(ctx(spec(), saved)).keep_instance_ids == ["i-0", "i-2", "i-3"]  # 75: it waits to join
