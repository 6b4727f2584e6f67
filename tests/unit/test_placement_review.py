"""The placement review (pure): move only when a clearly better placement pays for its move, and the
contract pieces the move and elastic gangs travel in."""

from __future__ import annotations

import pytest

from spotrelay.contracts.events import Directive
from spotrelay.contracts.recovery import Candidate, LaunchPlan
from spotrelay.contracts.workflow import WorkflowTimings
from spotrelay.domain.models import Attempt, Job
from spotrelay.domain.status import JobStatus
from spotrelay.placement import PoolEvent, apply_event, empty_stats, rank_pools
from spotrelay.placement.pool_stats import PoolStats
from spotrelay.placement.review import ReviewConfig, better_placement, work_rate
from spotrelay.ports.market import PoolQuote
from spotrelay.services.recovery_flow import backoff_seconds, failure_streak
from tests.unit.test_placement_policy import NOW, make_spec, quotes_for


def _pick(quotes: list[PoolQuote], market: str, instance_type: str = "p5.48xlarge") -> PoolQuote:
    return next(q for q in quotes if q.pool.market == market and q.pool.instance_type == instance_type)


def test_a_gang_on_on_demand_moves_to_spot_when_the_saving_pays_for_the_move() -> None:
    spec = make_spec()
    quotes = quotes_for(spec)
    move = better_placement(spec, _pick(quotes, "on-demand"), 4, quotes, {}, NOW)
    assert move is not None and move.target.pool.market == "spot" and move.target.nodes == 4
    assert move.gain_per_hour * move.horizon_hours > move.move_cost * 1.5 and not move.in_place
    assert "beats" in move.reason


def test_the_best_placement_stays_and_a_huge_margin_stays_too() -> None:
    spec = make_spec()
    quotes = quotes_for(spec)
    top = rank_pools(spec, quotes, {}, NOW)[0].quote
    assert better_placement(spec, top, 4, quotes, {}, NOW) is None
    od = _pick(quotes, "on-demand")
    assert better_placement(spec, od, 4, quotes, {}, NOW, review=ReviewConfig(margin=1e6)) is None


def test_a_running_gang_is_not_moved_for_its_own_pools_placement_score() -> None:
    # the score quoted for the gang's own pool is for launching another gang there, lower by what the gang
    # holds: it says nothing about the running gang (on Bamboo's p3 trace every 32-node gang moved twice
    # between pools of the same price for it, a boot and a restore each)
    spec = make_spec(markets=["spot"], instance_types=["p5.48xlarge"])
    quotes = [q.model_copy(update={"placement_score": 10.0}) for q in quotes_for(spec)]
    top = rank_pools(spec, quotes, {}, NOW)[0].quote
    here = top.model_copy(update={"placement_score": 3.0})
    same = [here if q.pool == top.pool else q for q in quotes]
    twin = next(q for q in same if q.pool != top.pool and q.price_per_hour == top.price_per_hour)
    assert twin.placement_score == 10.0
    assert better_placement(spec, here, 4, same, {}, NOW) is None


def test_a_move_does_not_pay_when_the_target_is_interrupted_all_the_time() -> None:
    spec = make_spec(markets=["spot", "on-demand"])
    quotes = quotes_for(spec)
    stats: dict[str, PoolStats] = {}
    for q in quotes:  # every spot pool: 400 reclaim waves in 100 instance-hours (cooldowns long over)
        if q.pool.market == "spot":
            s = empty_stats(q.pool.key)
            for i in range(400):  # five minutes apart: each its own wave
                s = apply_event(s, PoolEvent.INTERRUPTED, NOW - 86400 - (400 - i) * 300.0)
            stats[q.pool.key] = apply_event(s, PoolEvent.OBSERVED, NOW - 86400, hours=100.0)
    assert better_placement(spec, _pick(quotes, "on-demand"), 4, quotes, stats, NOW) is None


def test_a_shrunk_gang_grows_back_in_its_own_pool() -> None:
    spec = make_spec(min_nodes=2, markets=["spot"], instance_types=["p5.48xlarge"])
    quotes = quotes_for(spec)
    home = rank_pools(spec, quotes, {}, NOW)[0].quote
    move = better_placement(spec, home, 2, quotes, {}, NOW)
    assert move is not None and move.target.nodes == 4
    # only the two new ranks boot in place; elsewhere all four would
    assert move.in_place == (move.target.pool == home.pool)
    assert work_rate(move.target) > 0



def test_a_moves_cost_splits_the_catalogs_restore_at_the_computes_boot() -> None:
    """``boot_s`` (the compute's per-pool estimate, what the move's save deadline uses): a whole-gang move
    costs the catalog's restore minutes on every new node whatever the boot; growing in place, only the new
    ranks boot, so a longer boot moves cost off the staying ranks (before, 5 min for every type)."""
    spec = make_spec(markets=["spot", "on-demand"])
    quotes = quotes_for(spec)
    od = _pick(quotes, "on-demand")
    moves = [better_placement(spec, od, 4, quotes, {}, NOW, boot_s=lambda pool, b=b: b) for b in (300.0, 420.0)]
    assert moves[0] is not None and moves[1] is not None and not moves[0].in_place
    assert moves[0].move_cost == pytest.approx(moves[1].move_cost)
    assert better_placement(spec, od, 4, quotes, {}, NOW).move_cost == pytest.approx(moves[0].move_cost)
    spec = make_spec(min_nodes=2, markets=["spot"], instance_types=["p5.48xlarge"])
    quotes = quotes_for(spec)
    home = rank_pools(spec, quotes, {}, NOW)[0].quote
    grows = [better_placement(spec, home, 2, quotes, {}, NOW, boot_s=lambda pool, b=b: b) for b in (300.0, 420.0)]
    assert all(g is not None and g.in_place for g in grows)
    assert grows[1].move_cost < grows[0].move_cost  # type: ignore[union-attr]

def test_ranks_for_a_new_gang_follows_the_candidate_size_and_a_keeping_plan_its_world() -> None:
    pool = quotes_for(make_spec())[0].pool
    small = Candidate(pool=pool, price_per_hour=1.0, score=1.0, nodes=3)
    new = LaunchPlan(candidates=[small], launch_ranks=[0, 1, 2, 3])
    assert new.ranks_for(small) == (3, [0, 1, 2])
    keeping = LaunchPlan(candidates=[small], launch_ranks=[1], keep_instance_ids=["i-0", "i-2"], world_size=3)
    assert keeping.ranks_for(small) == (3, [1])
    legacy = LaunchPlan(candidates=[Candidate(pool=pool, price_per_hour=1.0, score=1.0)], launch_ranks=[0, 1])
    assert legacy.ranks_for(legacy.candidates[0]) == (2, [0, 1])


def test_restart_directive_carries_the_world_size() -> None:
    directive = Directive.restart("job", 3, 1, NOW, "grown back", world_size=4)
    assert Directive.model_validate(directive.model_dump(mode="json")).world_size == 4
    assert Directive.restart("job", 3, 1, NOW, "same size").world_size is None


def test_backoff_resets_after_a_healthy_stretch() -> None:
    timings = WorkflowTimings(backoff_s=30, backoff_max_s=600, healthy_s=3600)

    def job(*lengths: float) -> Job:
        attempts, t = [], NOW
        for i, length in enumerate(lengths, start=1):
            attempts.append(Attempt(number=i, started_at=t, ended_at=t + length))
            t += length + 60
        return Job(job_id="j", name="j", status=JobStatus.RECOVERING, attempts=attempts, recoveries=len(lengths))

    assert failure_streak(job(60, 60, 60), timings) == 3
    assert backoff_seconds(timings, failure_streak(job(60, 60, 60), timings)) == 120
    # a week of healthy training, then one short attempt: the backoff starts over
    assert failure_streak(job(60, 60, 7 * 86400, 60), timings) == 1
    assert backoff_seconds(timings, failure_streak(job(60, 60, 7 * 86400, 60), timings)) == 30


def test_a_spot_only_job_whose_pools_all_cool_waits_for_the_first_to_come_back() -> None:
    from spotrelay.errors import NoPlacementError
    from spotrelay.services.plan import _new_gang_plan

    spec = make_spec(markets=["spot"])
    quotes = quotes_for(spec)
    stats: dict[str, PoolStats] = {}
    for i, q in enumerate(quotes):  # interrupted one after another: the first cooldown ends soonest
        stats[q.pool.key] = apply_event(empty_stats(q.pool.key), PoolEvent.INTERRUPTED, NOW + 60 * i)
    job = Job(job_id="j", name="j", status=JobStatus.RECOVERING)
    first_end = min(s.cooldown_until for s in stats.values())
    plan = _new_gang_plan(spec, job, quotes, stats, NOW + 600)
    assert plan.candidates == [] and plan.wait_s == round(first_end - (NOW + 600))
    assert _new_gang_plan(spec, job, quotes, stats, first_end + 1).candidates  # then it places
    capped = make_spec(markets=["spot"], max_hourly_price=0.01)  # nothing would ever be allowed: fail
    with pytest.raises(NoPlacementError, match="max_hourly_price"):
        _new_gang_plan(capped, job, quotes_for(capped), stats, NOW + 600)


def test_the_jobs_own_short_spot_attempts_keep_it_from_moving_back_to_spot() -> None:
    from spotrelay.placement.review import spot_attempt_hours

    spec = make_spec()
    quotes = quotes_for(spec)
    spot = _pick(quotes, "spot").pool
    short = [Attempt(number=i, pool=spot, started_at=NOW + 600 * i, ended_at=NOW + 600 * i + 300) for i in range(4)]
    hours = spot_attempt_hours(short)
    assert hours is not None and abs(hours - 300 / 3600) < 1e-9
    assert spot_attempt_hours(short[:1]) is None  # one attempt says little
    od = _pick(quotes, "on-demand")
    assert better_placement(spec, od, 4, quotes, {}, NOW, spot_hours=hours) is None
    assert better_placement(spec, od, 4, quotes, {}, NOW, spot_hours=12.0) is not None


def test_a_move_pays_for_reading_its_checkpoint_from_another_region() -> None:
    """Both pools are away from the checkpoints (eu-west-1), so the hourly distance is the same either
    side: what decides is the move's one restore read across regions, the new ranks' shards."""
    from spotrelay.spec.models import JobSpec

    def spec_with(size_gb: float) -> JobSpec:
        doc = make_spec(regions=["us-east-1", "us-west-2"], instance_types=["p4d.24xlarge"],
                        markets=["spot"]).model_dump(mode="json", exclude_none=True)
        doc["checkpoint"].update(size_gb=size_gb, region="eu-west-1")
        return JobSpec.model_validate(doc)

    small = spec_with(1.0)
    quotes = quotes_for(small, spot_prices={"us-east-1/p4d.24xlarge": 10.0, "us-west-2/p4d.24xlarge": 6.0})
    here = next(q for q in quotes if q.pool.region == "us-east-1")
    light = better_placement(small, here, 4, quotes, {}, NOW)
    assert light is not None and light.target.pool.region == "us-west-2"
    medium = better_placement(spec_with(101.0), here, 4, quotes, {}, NOW)
    assert medium is not None and medium.move_cost == pytest.approx(light.move_cost + 100.0 * 0.02)
    assert better_placement(spec_with(200_000.0), here, 4, quotes, {}, NOW) is None  # $4,000 to read it
