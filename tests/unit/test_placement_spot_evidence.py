"""placement/spot_evidence.py: did the job's own spot attempts pay per useful step against
on-demand? And what Plan (the wait, the candidates) and the review do with the answer."""

from __future__ import annotations

from spotrelay.domain.models import Attempt, Job, Pool
from spotrelay.domain.status import JobStatus
from spotrelay.placement import spot_evidence as se
from spotrelay.placement.spot_wait import EVIDENCE_WAIT_MINUTES, wait_minutes
from spotrelay.services.plan import _new_gang_plan
from spotrelay.spec.models import JobSpec
from tests.unit.test_placement_gang_fit import _scored
from tests.unit.test_placement_policy import NOW, make_spec, quotes_for

SPOT = Pool(region="us-east-1", az="us-east-1a", instance_type="p5.48xlarge", market="spot")
OD = SPOT.model_copy(update={"market": "on-demand"})
H = 3600.0


def _attempt(n: int, pool: Pool, start: float, hours: float, steps: int, cost: float, *, trained_h: float = 0.0,
             saved_late_s: float = 0.0) -> Attempt:
    """An attempt of 4 p5 nodes that resumed at step 100 * n and committed ``steps`` more, ``trained_h``
    after its resume (its step rate), ``saved_late_s`` after its close (a notice's save)."""
    end = start + hours * H
    return Attempt(number=n, pool=pool, started_at=start, ended_at=end, cost=cost, price_per_hour=cost / hours / 4,
                   nodes=4, world_size=4, resumed_from_step=100 * n, resumed_at=start + 600,
                   saved_step=100 * n + steps if steps else None,
                   saved_at=(start + 600 + trained_h * H if trained_h else end + saved_late_s) if steps else None)


def _od_quotes() -> list:
    return [q for q in quotes_for(make_spec()) if q.pool.market == "on-demand"]


def _per_step_usd() -> float:
    """On-demand's price for one step at the measured rate of ``_rated`` (100 steps an hour on 4 p5)."""
    od_work = min(q.price_per_hour / 2.8 if q.pool.instance_type == "p5.48xlarge" else q.price_per_hour
                  for q in _od_quotes())
    return 4 * 2.8 / 100 * od_work


def _rated() -> Attempt:  # an on-demand attempt that trained 100 steps in its first hour: the step rate
    return _attempt(0, OD, NOW - 100 * H, 2.0, 100, 1000.0, trained_h=1.0)


def _spot_run(cost_share: float, count: int = se.MIN_SPOT_ATTEMPTS) -> list[Attempt]:
    """``count`` settled spot attempts back to back, 10 steps each (at the same rate), each billed
    ``cost_share`` of on-demand's price for them."""
    cost = cost_share * 10 * _per_step_usd()
    return [_rated(), *[_attempt(i + 1, SPOT, NOW - 50 * H + i * H / 2, 0.5, 10, cost, trained_h=0.1)
                        for i in range(count)]]


def test_the_step_rate_and_useful_steps_come_from_the_records() -> None:
    a = _rated()
    assert se.useful_steps(a) == 100
    assert abs(se.step_node_hours([a]) - 4 * 2.8 / 100) < 1e-9  # 4 p5 nodes, 100 steps an hour
    assert se.step_node_hours([_attempt(1, SPOT, NOW, 1.0, 0, 5.0)]) is None  # never got past its resume
    assert se.useful_steps(_attempt(1, SPOT, NOW, 1.0, 0, 5.0)) == 0


def test_spot_paid_or_lost_against_on_demand_for_the_same_steps() -> None:
    cheap = se.spot_evidence(_spot_run(0.5), _od_quotes(), NOW)
    assert cheap is not None and cheap.paid and not cheap.lost
    assert abs(cheap.on_demand_cost - se.MIN_SPOT_ATTEMPTS * 10 * _per_step_usd()) < 1e-6
    between = se.spot_evidence(_spot_run(0.9), _od_quotes(), NOW)
    assert between is not None and not between.paid and not between.lost  # neither clearly
    dear = se.spot_evidence(_spot_run(1.2), _od_quotes(), NOW)
    assert dear is not None and dear.lost and se.spot_did_not_pay(_spot_run(1.2), _od_quotes(), NOW)


def test_near_parity_is_no_verdict_of_lost() -> None:
    """A window that swings a little past on-demand's price (a stormy spell) does not park the job on
    on-demand: lost needs more than LOST_SHARE of on-demand's price for the same steps."""
    assert 1.0 < se.LOST_SHARE < 1.2
    near = se.spot_evidence(_spot_run(1.05), _od_quotes(), NOW)
    assert near is not None and not near.lost and not near.paid
    assert not se.spot_did_not_pay(_spot_run(1.05), _od_quotes(), NOW)
    past = se.spot_evidence(_spot_run(se.LOST_SHARE + 0.02), _od_quotes(), NOW)
    assert past is not None and past.lost


def test_no_verdict_on_attempts_that_span_less_than_the_minimum() -> None:
    """Ten spot gangs that all died within an hour of a bad start are not a market's verdict yet."""
    cost = 2.0 * 10 * _per_step_usd()
    quick = [_rated(), *[_attempt(i + 1, SPOT, NOW - 5 * H + i * H / 12, 0.2, 10, cost, trained_h=0.1)
                         for i in range(se.MIN_SPOT_ATTEMPTS)]]
    assert se.spot_evidence(quick, _od_quotes(), NOW) is None and not se.spot_did_not_pay(quick, _od_quotes(), NOW)
    spread = [_rated(), *[_attempt(i + 1, SPOT, NOW - 9 * H + i * H * se.MIN_SPOT_SPAN_HOURS / 8, 0.2, 10, cost,
                                   trained_h=0.1) for i in range(se.MIN_SPOT_ATTEMPTS)]]
    verdict = se.spot_evidence(spread, _od_quotes(), NOW)
    assert verdict is not None and verdict.lost


def test_no_verdict_without_enough_attempts_a_rate_or_on_demand() -> None:
    assert se.spot_evidence(_spot_run(2.0, se.MIN_SPOT_ATTEMPTS - 1), _od_quotes(), NOW) is None
    unrated = [a.model_copy(update={"resumed_at": None}) for a in _spot_run(2.0)]
    assert se.spot_evidence(unrated, _od_quotes(), NOW) is None
    spot_only = [q for q in quotes_for(make_spec()) if q.pool.market == "spot"]
    assert se.spot_evidence(_spot_run(2.0), spot_only, NOW) is None
    assert not se.spot_did_not_pay(_spot_run(2.0, se.MIN_SPOT_ATTEMPTS - 1), _od_quotes(), NOW)


def test_an_attempt_still_saving_is_not_judged_yet() -> None:
    run = _spot_run(2.0)
    just = run[-1].model_copy(update={"ended_at": NOW - 60, "saved_step": None, "saved_at": None})
    assert se.spot_evidence([*run[:-1], just], _od_quotes(), NOW) is None  # one short of the minimum
    saved = just.model_copy(update={"saved_step": just.resumed_from_step + 5, "saved_at": NOW - 30})
    assert se.spot_evidence([*run[:-1], saved], _od_quotes(), NOW) is not None  # it saved after its close


def test_billed_counts_the_final_save_and_survivors_kept_for_the_next_attempt() -> None:
    """After the close: the ranks the next attempt did not carry over are billed to their final save, those
    it carried (``kept``) until it started and no longer: from then on its own cost holds them."""
    a = _attempt(1, SPOT, NOW, 1.0, 10, 40.0, saved_late_s=360.0)  # 4 nodes at 10 USD/h, saved 0.1 h late
    assert abs(se.billed(a) - (40.0 + 4 * 10.0 * 0.1)) < 1e-9
    kept = Attempt(number=2, pool=SPOT, started_at=a.ended_at + 1800, kept=3)  # the lost rank came after a backoff
    assert abs(se.billed(a, kept) - (40.0 + 3 * 10.0 * 0.5 + 1 * 10.0 * 0.1)) < 1e-9
    at_once = kept.model_copy(update={"started_at": a.ended_at})  # launched at the notice: 3 billed in it already
    assert abs(se.billed(a, at_once) - (40.0 + 1 * 10.0 * 0.1)) < 1e-9
    new_gang = kept.model_copy(update={"kept": 0})  # a new gang, even in the same pool: every rank drains
    assert abs(se.billed(a, new_gang) - se.billed(a)) < 1e-9
    elsewhere = kept.model_copy(update={"pool": OD, "kept": 0})
    assert abs(se.billed(a, elsewhere) - se.billed(a)) < 1e-9


def _job(attempts: list[Attempt]) -> Job:
    return Job(job_id="j", name="j", status=JobStatus.RECOVERING, attempts=attempts, attempt=len(attempts))


def _spec(minutes: float | None) -> JobSpec:
    doc = make_spec().model_dump(mode="json")
    doc["recovery"]["spot_wait_minutes"] = minutes
    return JobSpec.model_validate(doc)


def test_the_unset_wait_follows_the_evidence_and_a_stated_one_wins() -> None:
    quotes = quotes_for(make_spec())
    assert wait_minutes(_spec(None), _job([]), quotes, NOW) == EVIDENCE_WAIT_MINUTES  # no verdict yet: try spot
    assert wait_minutes(_spec(None), _job(_spot_run(0.5)), quotes, NOW) == EVIDENCE_WAIT_MINUTES
    assert wait_minutes(_spec(None), _job(_spot_run(1.2)), quotes, NOW) == 0.0
    assert wait_minutes(_spec(30), _job(_spot_run(1.2)), quotes, NOW) == 30
    assert wait_minutes(_spec(0), _job(_spot_run(0.5)), quotes, NOW) == 0


def test_plan_leaves_spot_out_when_it_did_not_pay() -> None:
    quotes = _scored(quotes_for(make_spec()), 9.0)  # every spot pool holds the gang
    paid = _new_gang_plan(make_spec(), _job(_spot_run(0.5)), quotes, {}, NOW)
    assert paid.candidates[0].pool.market == "spot"
    lost = _new_gang_plan(make_spec(), _job(_spot_run(1.2)), quotes, {}, NOW)
    assert lost.wait_s == 0 and {c.pool.market for c in lost.candidates} == {"on-demand"}


def test_the_review_holds_on_demand_after_spot_did_not_pay_then_tries_again() -> None:
    run = _spot_run(1.2)
    last_end = max(a.ended_at or 0 for a in run if a.pool == SPOT)
    back = [*run, Attempt(number=9, pool=OD, started_at=last_end, ended_at=None)]
    quotes = _od_quotes()
    assert not se.off_on_demand_allowed("spot", "on-demand", back, quotes, last_end + H)
    assert se.off_on_demand_allowed("spot", "on-demand", back, quotes, last_end + se.HOLD_HOURS * H)
    assert se.off_on_demand_allowed("on-demand", "on-demand", back, quotes, last_end + H)  # not a move to spot
    assert se.off_on_demand_allowed("spot", "spot", back, quotes, last_end + H)
    # each earlier return to on-demand doubles the hold
    again = [*back[:-1], Attempt(number=9, pool=OD, started_at=last_end - 3 * H, ended_at=last_end - 2 * H),
             Attempt(number=10, pool=SPOT, started_at=last_end - 2 * H, ended_at=last_end, cost=1.0),
             Attempt(number=11, pool=OD, started_at=last_end)]
    assert se.returns_to_on_demand(again) == 2
    assert not se.off_on_demand_allowed("spot", "on-demand", again, quotes, last_end + se.HOLD_HOURS * H)
    assert se.off_on_demand_allowed("spot", "on-demand", again, quotes, last_end + 2 * se.HOLD_HOURS * H)
    paid = [*_spot_run(0.5), Attempt(number=9, pool=OD, started_at=NOW)]
    assert se.off_on_demand_allowed("spot", "on-demand", paid, quotes, NOW + 60)


def _stalled(count: int) -> list[Attempt]:
    """``count`` spot gangs in a row reclaimed before they trained (no resume, nothing committed)."""
    return [Attempt(number=i + 1, pool=SPOT, started_at=NOW - 4 * H + i * 900, ended_at=NOW - 4 * H + i * 900 + 400,
                    cost=50.0, nodes=4, world_size=4) for i in range(count)]


def test_spot_is_lost_after_the_stall_limit_of_spot_gangs_that_trained_nothing() -> None:
    # a market whose gangs die before they save: on-demand, before the stall budget fails the job
    spec = make_spec()
    limit = se.stall_limit(spec)
    assert limit == spec.recovery.max_stalled_recoveries - 1
    quotes = _od_quotes()
    assert not se.spot_did_not_pay(_stalled(limit - 1), quotes, NOW, stalled=limit)
    assert se.spot_did_not_pay(_stalled(limit), quotes, NOW, stalled=limit)  # no step rate needed
    assert se.spot_did_not_pay([_rated(), *_stalled(limit)], quotes, NOW, stalled=limit)
    trained = _stalled(limit)
    trained[-3] = _attempt(trained[-3].number, SPOT, trained[-3].started_at or 0.0, 0.2, 5, 50.0, trained_h=0.1)
    assert not se.spot_did_not_pay(trained, quotes, NOW, stalled=limit)  # one committed steps: not stalled
    crashed_on_od = _stalled(limit)
    crashed_on_od[-1] = crashed_on_od[-1].model_copy(update={"pool": OD})
    assert not se.spot_did_not_pay(crashed_on_od, quotes, NOW, stalled=limit)  # not the spot market's doing
    spot_quotes = _scored(quotes_for(spec), 9.0)  # every spot pool holds the gang
    lost = _new_gang_plan(spec, _job(_stalled(limit)), spot_quotes, {}, NOW)
    assert lost.wait_s == 0 and {c.pool.market for c in lost.candidates} == {"on-demand"}
    assert not se.off_on_demand_allowed("spot", "on-demand", [*_stalled(limit), Attempt(number=99, pool=OD)],
                                        quotes, NOW, stalled=limit)
    doc = spec.model_dump(mode="json")
    doc["recovery"]["max_stalled_recoveries"] = 3  # a smaller stall budget gives spot up sooner
    assert se.stall_limit(JobSpec.model_validate(doc)) == 2
    doc["recovery"]["max_stalled_recoveries"] = 0
    assert se.stall_limit(JobSpec.model_validate(doc)) == 1


def test_one_stalled_recovery_from_the_budget_plan_offers_on_demand_only() -> None:
    spec = make_spec()
    budget = spec.recovery.max_stalled_recoveries
    assert se.last_chance(spec, budget) and not se.last_chance(spec, budget - 1)
    quotes = _scored(quotes_for(spec), 9.0)  # every spot pool holds the gang
    job = _job([]).model_copy(update={"stalled_recoveries": budget})
    plan = _new_gang_plan(spec, job, quotes, {}, NOW)
    assert plan.wait_s == 0 and {c.pool.market for c in plan.candidates} == {"on-demand"}
    fresh = _new_gang_plan(spec, _job([]), quotes, {}, NOW)
    assert fresh.candidates[0].pool.market == "spot"
