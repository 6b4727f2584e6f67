"""Gang fit: a spot pool whose placement score for the whole gang is low is not a candidate, a plan
with no pool left waits and asks again, replace-lost keeps survivors only where their pool can take
the lost ranks, and the review prices a spot move with the job's own recent spot attempts."""

from __future__ import annotations

import pytest

from spotrelay.domain.models import Attempt, Job, NodeState
from spotrelay.domain.status import JobStatus
from spotrelay.placement import evaluate_pools, rank_pools
from spotrelay.placement.gang_fit import fits, quote_fits
from spotrelay.placement.policy import GANG_FIT_REASON, PlacementConfig
from spotrelay.placement.review import better_placement, spot_attempt_hours
from spotrelay.ports.market import PoolQuote
from spotrelay.recovery import plan_recovery
from spotrelay.services.plan import GANG_FIT_RECHECK_S, _new_gang_plan
from tests.unit.test_placement_policy import NOW, make_spec, quotes_for
from tests.unit.test_recovery_strategies import HOME, ctx, gang, spec


def _scored(quotes: list[PoolQuote], score: float, market: str = "spot") -> list[PoolQuote]:
    return [q.model_copy(update={"placement_score": score}) if q.pool.market == market else q for q in quotes]


def test_a_spot_pool_too_full_for_the_gang_is_dropped_with_the_reason() -> None:
    s = make_spec()
    quotes = _scored(quotes_for(s), 5.0)
    ranking = evaluate_pools(s, quotes, {}, NOW)
    assert all(r.pool.market == "on-demand" for r in ranking.ranked)
    spot = [k for k in ranking.dropped if k.endswith("/spot")]
    assert spot and all(ranking.dropped[k].startswith(GANG_FIT_REASON) for k in spot)
    # a pool where the survivors run stays; no score (unknown) or a high one filters nothing
    home = next(q.pool.key for q in quotes if q.pool.market == "spot")
    assert any(r.pool.key == home for r in evaluate_pools(s, quotes, {}, NOW, running=frozenset({home})).ranked)
    for ok in (quotes_for(s), _scored(quotes_for(s), 9.0)):
        assert rank_pools(s, ok, {}, NOW)[0].pool.market == "spot"
    assert rank_pools(s, quotes, {}, NOW, config=PlacementConfig(min_gang_score=0))[0].pool.market == "spot"


def test_a_smaller_gang_needs_a_score_asked_for_its_size_or_larger() -> None:
    s = make_spec(min_nodes=2)  # the quotes' scores were asked for 4 nodes: a low one rules 4 out
    quotes = _scored(quotes_for(s), 3.0)
    assert not [r for r in rank_pools(s, quotes, {}, NOW, gang_sizes=True) if r.pool.market == "spot"]
    sized = {3: {q.pool.key: 9.0 for q in quotes}}  # Plan's probe for 3 nodes says they fit
    spot = [r for r in rank_pools(s, quotes, {}, NOW, gang_sizes=True, sized=sized) if r.pool.market == "spot"]
    assert spot and {r.nodes for r in spot} == {2, 3}


def test_a_spot_only_job_with_no_pool_that_fits_waits_and_asks_again() -> None:
    s = make_spec(markets=["spot"])
    job = Job(job_id="j", name="j", status=JobStatus.RECOVERING)
    plan = _new_gang_plan(s, job, _scored(quotes_for(s), 4.0), {}, NOW)
    assert plan.candidates == [] and plan.wait_s == GANG_FIT_RECHECK_S
    assert _new_gang_plan(s, job, _scored(quotes_for(s), 9.0), {}, NOW).candidates


def test_replace_lost_keeps_survivors_only_where_the_pool_takes_the_lost_ranks() -> None:
    nodes = gang({2: NodeState.DOOMED})
    asked: list[int] = []

    def sized(score: float):  # the MarketData port, scores sized for k nodes
        def quotes(k: int) -> list[PoolQuote]:
            asked.append(k)
            return [q.model_copy(update={"placement_score": score}) for q in base.quotes]
        return quotes

    base = ctx(spec(), nodes)
    full = base.model_copy(update={"quotes_for": sized(2.0)})
    plan = plan_recovery(full)
    assert plan.action == "new-cluster" and plan.keep_instance_ids == [] and asked == [1]
    assert plan.pool != HOME  # the pool that just shrank is not where the new gang goes
    roomy = plan_recovery(base.model_copy(update={"quotes_for": sized(9.0)}))
    assert roomy.action == "replace-lost" and roomy.pool == HOME and roomy.launch_ranks == [2]
    assert plan_recovery(base).action == "replace-lost"  # not asked (None): as before


def test_the_review_prices_a_spot_move_with_the_jobs_recent_spot_attempts() -> None:
    s = make_spec()
    quotes = quotes_for(s)
    od = next(q for q in quotes if q.pool.market == "on-demand" and q.pool.instance_type == "p5.48xlarge")
    spot = next(q.pool for q in quotes if q.pool.market == "spot")
    # spot gangs of this job lasted 40 min: the move back from on-demand still pays (its interruptions
    # are priced in the useful fraction and the saving outlasts the first one)
    lasting = [Attempt(number=i, pool=spot, started_at=NOW - 9000 + 2400 * i, ended_at=NOW - 6600 + 2400 * i)
               for i in range(3)]
    hours = spot_attempt_hours(lasting, now=NOW)
    assert hours is not None and abs(hours - 2 / 3) < 1e-9
    move = better_placement(s, od, 4, quotes, {}, NOW, spot_hours=hours)
    assert move is not None and move.target.pool.market == "spot" and move.horizon_hours == 24.0
    assert move.target.breakdown["gang_interruptions_per_hour"] == 1.5
    # minutes-long spot gangs: spot is dearer per useful hour than on-demand, stay
    assert better_placement(s, od, 4, quotes, {}, NOW, spot_hours=0.05) is None
    # evidence older than the window is stale: a job parked on on-demand looks at spot again
    assert spot_attempt_hours(lasting, now=NOW + 7 * 3600) is None
    assert spot_attempt_hours(lasting, now=NOW + 4 * 3600, within_hours=6.0) is not None


def test_a_trace_pool_offers_no_capacity_it_reclaims_within_the_notice_window(tmp_path) -> None:
    from spotrelay.sim.inputs import read_bamboo
    from spotrelay.sim.market import TraceCapacity

    trace = tmp_path / "t.csv"  # 3 nodes up; one goes at 1000 s, one comes back at 2000 s
    trace.write_text("0,add,a\n0,add,b\n0,add,c\n1000000,remove,a\n2000000,add,d\n3000000,remove,b\n")
    cap = TraceCapacity(read_bamboo(trace), 0.0)
    assert cap.capacity(900.0) == 3 and cap.offered(900.0) == 2  # the drop at 1000 s is inside the notice
    assert cap.offered(800.0) == 3 and cap.offered(1500.0) == 2 and cap.offered(2500.0) == 3


def test_a_slot_pool_offers_no_capacity_its_next_slot_takes_back_within_the_notice_window() -> None:
    """The synthetic market and a pools CSV, as the trace pools: during the notice window before a
    slot that holds fewer nodes, a launch gets only what that slot holds and the derived score says
    so (a replacement launched into a pool draining a wave was reclaimed before it booted)."""
    import random

    from spotrelay.domain.models import Pool
    from spotrelay.sim.inputs import Slot
    from spotrelay.sim.market import NOTICE_S, SimPool, SlotCapacity

    hour = 3600.0  # 16 nodes for an hour, 4 the next, then unlimited; repeating every 3 hours
    cap = SlotCapacity([Slot(0.0, 1.0, capacity=16), Slot(hour, 1.0, capacity=4), Slot(2 * hour, 1.0)], 3 * hour)
    edge = hour - NOTICE_S
    assert cap.offered(edge - 1) == 16 and cap.offered(edge + 1) == 4 and cap.capacity(edge + 1) == 16
    assert cap.offered(2 * hour - 60) == 4  # the next slot has no limit: nothing taken back
    assert cap.offered(3 * hour - 60) == 16 and cap.offered(3 * hour - 600) is None  # (the next cycle)
    short = SlotCapacity([Slot(0.0, 1.0, capacity=16), Slot(hour, 1.0, capacity=8), Slot(hour + 60, 1.0, capacity=2),
                          Slot(hour + 120, 1.0)], 2 * hour)  # two drops inside one notice window
    assert short.offered(hour - 90) == 8 and short.offered(hour - 30) == 2 and short.offered(hour + 30) == 2
    quick = SimPool(pool=Pool(region="us-east-1", az="us-east-1a", instance_type="p5.48xlarge", market="spot"),
                    key="q", on_demand_price=98.0, spot_price=None, band=1, gpus=8, capacity=short)
    assert quick.quote_key(hour - 90, 4, 0) != quick.quote_key(hour - 30, 4, 0)  # one slot, two answers
    rng = random.Random(0)
    assert cap.grant(edge - 1, 16, set(), rng) is not None
    assert cap.grant(edge + 1, 5, set(), rng) is None and cap.grant(edge + 1, 4, set(), rng) is not None
    pool = SimPool(pool=Pool(region="us-east-1", az="us-east-1a", instance_type="p5.48xlarge", market="spot"),
                   key="k", on_demand_price=98.0, spot_price=None, band=1, gpus=8, capacity=cap)
    before, during = pool.placement_score(edge - 1, 12), pool.placement_score(edge + 1, 12)
    assert before is not None and during is not None and during < before
    assert pool.quote_key(edge - 1, 12, 0) != pool.quote_key(edge + 1, 12, 0)  # the cached quote follows


def test_elastic_sizes_are_judged_by_scores_asked_for_them() -> None:
    from spotrelay.placement.gang_fit import fits, probe_sizes

    s = make_spec(nodes=32, min_nodes=16)
    assert probe_sizes(s) == [28, 24, 20, 16] and probe_sizes(make_spec()) == []
    quotes = _scored(quotes_for(s), 3.0)  # asked for 32: no pool holds the full gang
    spot = [q.pool.key for q in quotes if q.pool.market == "spot"]
    sized = {m: {k: (9.0 if m <= 20 else 4.0) for k in spot} for m in probe_sizes(s)}
    assert fits(sized, spot[0], 20, 8.0) and fits(sized, spot[0], 17, 8.0)  # scored for 20: room for 17
    assert fits(sized, spot[0], 21, 8.0) is False and fits({}, spot[0], 21, 8.0) is None
    ranked = rank_pools(s, quotes, {}, NOW, gang_sizes=True, sized=sized)
    assert {r.nodes for r in ranked if r.pool.market == "spot"} == set(range(16, 21))


def test_a_move_the_job_made_is_not_a_short_spot_life() -> None:
    """A gang the review moved away from was not lost: its hours count toward how long the job's spot
    gangs last, its end is no loss. Counted as a loss, one early move (30 min in) halved the evidence
    and kept a gang for 60 h in a pool 8% dearer than the cheapest (the synthetic market, seed 3008)."""
    s = make_spec()
    quotes = quotes_for(s)
    spot = [q for q in quotes if q.pool.market == "spot" and q.pool.instance_type == "p5.48xlarge"]
    here = spot[0].model_copy(update={"price_per_hour": spot[0].price_per_hour * 1.3})  # its slot got dear
    quotes = [here if q.pool == here.pool else q for q in quotes]
    lost = Attempt(number=1, pool=spot[1].pool, started_at=NOW - 5 * 3600, ended_at=NOW - 3600,
                   end_reason="interrupted")
    moved = Attempt(number=2, pool=spot[1].pool, started_at=NOW - 3600, ended_at=NOW - 1800, end_reason="migrate")
    hours = spot_attempt_hours([lost, moved])
    assert hours == 4.5  # 4.5 h on spot, one loss (the mean of the two lives, 2.25 h, was the old reading)
    move = better_placement(s, here, 4, quotes, {}, NOW, spot_hours=hours)
    assert move is not None and move.target.pool.market == "spot" and move.horizon_hours == 4.5
    assert better_placement(s, here, 4, quotes, {}, NOW, spot_hours=2.25) is None  # what the old reading did
    # lives the job ended itself only (moves, a stop, its code's failure): no loss seen, no evidence
    ended = [moved.model_copy(update={"number": 3, "end_reason": r}) for r in ("succeeded", "cancelled", "user-error")]
    assert spot_attempt_hours([moved, *ended]) is None
    # an end without a reason (an older record) counts as a loss, as before
    assert spot_attempt_hours([lost.model_copy(update={"end_reason": None}), moved]) == 4.5


def test_the_running_spot_gang_counts_its_hours_without_a_loss() -> None:
    """On spot, the gang training now has lived ``now - started_at`` without a loss: its hours count too
    (a long calm spell after two early losses is evidence, not a gap); from on-demand there is none."""
    from spotrelay.placement.review import review_spot_hours

    spot = quotes_for(make_spec())[0].pool
    early = [Attempt(number=1, pool=spot, started_at=NOW - 13 * 3600, ended_at=NOW - 11 * 3600,
                     end_reason="interrupted"),
             Attempt(number=2, pool=spot, started_at=NOW - 11 * 3600, ended_at=NOW - 10 * 3600, end_reason="node-lost")]
    running = Attempt(number=3, pool=spot, started_at=NOW - 10 * 3600)
    assert spot_attempt_hours([*early, running]) == 1.5  # closed attempts alone: 3 h, two losses
    assert review_spot_hours([*early, running], "spot", NOW) == 6.5  # and the running gang's 10 h
    assert review_spot_hours([*early, running], "spot", NOW + 3600) == 7.0  # (it grows while the gang lasts)
    od = quotes_for(make_spec())[1].pool
    assert review_spot_hours([*early, running.model_copy(update={"pool": od})], "on-demand", NOW) == 1.5


def test_only_a_gang_parked_on_on_demand_forgets_old_spot_evidence() -> None:
    from spotrelay.placement.review import EVIDENCE_HOURS, review_spot_hours

    spot = quotes_for(make_spec())[0].pool
    old = [Attempt(number=i, pool=spot, started_at=NOW + 600 * i, ended_at=NOW + 600 * i + 300) for i in range(3)]
    later = NOW + (EVIDENCE_HOURS + 1) * 3600
    assert review_spot_hours(old, "on-demand", later) is None  # stale: look at spot again
    assert review_spot_hours(old, "spot", later) is not None  # on spot it is the latest there is
    assert review_spot_hours(old, "on-demand", NOW + 3600) is not None


@pytest.mark.parametrize("sized", [None, {}, {16: {"p": 9.0}}, {16: {"p": None}, 24: {"q": 9.0}}])
def test_quote_fits_answers_as_fits_over_the_whole_mapping(sized: dict[int, dict[str, float | None]] | None) -> None:
    """_why_not's shortcut (no mapping built without sized scores) says what fits says."""
    for score in (None, 3.0, 8.0, 9.5):
        for nodes in (8, 16, 24, 32, 40):
            whole = {32: {"p": score}, **(sized or {})}
            assert quote_fits(score, 32, sized, "p", nodes, 8.0) == fits(whole, "p", nodes, 8.0), (score, nodes)
