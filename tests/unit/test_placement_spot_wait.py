"""recovery.spot_wait_minutes: with no training gang, Plan waits (bounded) for a spot pool instead
of launching on on-demand or on a spot pool that does far less work per dollar; then falls back."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from spotrelay.domain.models import Attempt, Job
from spotrelay.domain.status import JobStatus
from spotrelay.placement.spot_wait import (
    EVIDENCE_WAIT_MINUTES,
    SPOT_WAIT_FACTOR,
    plan_view,
    saves,
    spot_wait_s,
    stopped_at,
    wait_left_s,
    work_price,
)
from spotrelay.ports.market import PoolQuote
from spotrelay.services.plan import GANG_FIT_RECHECK_S, _new_gang_plan
from spotrelay.spec.models import JobSpec
from tests.unit.test_placement_gang_fit import _scored
from tests.unit.test_placement_policy import NOW, make_spec, quotes_for


def _wait(spec: JobSpec, job: Job, best: PoolQuote, quotes: list[PoolQuote], now: float = NOW) -> int:
    """Plan's question: its view of the quotes, then the wait before launching on ``best``."""
    return spot_wait_s(spec, job, best, quotes, now, GANG_FIT_RECHECK_S, plan_view(spec, job, quotes, now))


def _waiting(minutes: float, **resources: Any) -> JobSpec:
    doc = make_spec(**resources).model_dump(mode="json")
    doc["recovery"]["spot_wait_minutes"] = minutes
    return JobSpec.model_validate(doc)


def _stopped(ago_s: float) -> Job:
    ended = Attempt(number=1, started_at=NOW - ago_s - 3600, ended_at=NOW - ago_s, end_reason="interrupted")
    return Job(job_id="j", name="j", status=JobStatus.RECOVERING, attempts=[ended], attempt=1)


def _of(quotes: list[PoolQuote], market: str, itype: str) -> PoolQuote:
    return next(q for q in quotes if q.pool.market == market and q.pool.instance_type == itype)


def test_on_demand_best_waits_until_the_limit_then_falls_back() -> None:
    s = _waiting(30)
    quotes = _scored(quotes_for(s), 4.0)  # no spot pool holds the gang now: on-demand ranks first
    assert _new_gang_plan(_waiting(0), _stopped(60), quotes, {}, NOW).candidates[0].pool.market == "on-demand"
    plan = _new_gang_plan(s, _stopped(60), quotes, {}, NOW)
    assert plan.candidates == [] and plan.wait_s == GANG_FIT_RECHECK_S
    near = _new_gang_plan(s, _stopped(30 * 60 - 100), quotes, {}, NOW)
    assert near.candidates == [] and near.wait_s == 100  # never past the limit
    late = _new_gang_plan(s, _stopped(30 * 60), quotes, {}, NOW)
    assert late.wait_s == 0 and late.candidates[0].pool.market == "on-demand"


def test_the_wait_and_its_rechecks_run_at_the_time_scale() -> None:
    """``WorkflowTimings.time_scale`` (the twin's boot scale): 30 minutes of waiting are 18 s of the
    clock at 0.01, re-checked every 3 s; at 1 (AWS) nothing changes."""
    s = _waiting(30)
    quotes = _scored(quotes_for(s), 4.0)  # no spot pool holds the gang now: on-demand ranks first
    assert _new_gang_plan(s, _stopped(10), quotes, {}, NOW, time_scale=1.0).wait_s == GANG_FIT_RECHECK_S
    plan = _new_gang_plan(s, _stopped(10), quotes, {}, NOW, time_scale=0.01)
    assert plan.candidates == [] and plan.wait_s == 3
    assert _new_gang_plan(s, _stopped(17), quotes, {}, NOW, time_scale=0.01).wait_s == 1  # never past 18 s
    late = _new_gang_plan(s, _stopped(18), quotes, {}, NOW, time_scale=0.01)
    assert late.wait_s == 0 and late.candidates[0].pool.market == "on-demand"


def test_a_spot_pool_that_fits_launches_at_once_without_an_on_demand_fallback() -> None:
    s = _waiting(60)
    quotes = _scored(quotes_for(s), 9.0)
    today = _new_gang_plan(_waiting(0), _stopped(0), quotes, {}, NOW)
    assert any(c.pool.market == "on-demand" for c in today.candidates)
    plan = _new_gang_plan(s, _stopped(0), quotes, {}, NOW)
    # while it may still wait, provision gets no on-demand candidate to fall back to on a capacity error
    assert plan.wait_s == 0 and plan.candidates and {c.pool.market for c in plan.candidates} == {"spot"}
    late = _new_gang_plan(s, _stopped(3600), quotes, {}, NOW)
    assert any(c.pool.market == "on-demand" for c in late.candidates)


def test_a_spot_pool_doing_far_less_work_per_dollar_waits() -> None:
    s = _waiting(60)
    # flat prices (Bamboo's): p4d does 1/2.8 of p5's work for the same price per node-hour
    quotes = [q.model_copy(update={"price_per_hour": 0.91 if q.pool.market == "spot" else 3.06})
              for q in quotes_for(s)]
    p4d, p5 = _of(quotes, "spot", "p4d.24xlarge"), _of(quotes, "spot", "p5.48xlarge")
    assert work_price(p4d) > SPOT_WAIT_FACTOR * work_price(p5)
    assert _wait(s, _stopped(60), p4d, quotes) == GANG_FIT_RECHECK_S
    assert _wait(s, _stopped(60), p5, quotes) == 0


def test_no_wait_when_off_training_gang_open_or_no_spot_allowed() -> None:
    quotes = _scored(quotes_for(make_spec()), 4.0)
    od = _of(quotes, "on-demand", "p5.48xlarge")
    # 0: launch the best candidate at once
    assert _wait(_waiting(0), _stopped(60), od, quotes) == 0
    s = _waiting(30)
    running = Job(job_id="j", name="j", status=JobStatus.RUNNING, attempt=1,
                  attempts=[Attempt(number=1, started_at=NOW - 60)])
    assert stopped_at(running) is None and _wait(s, running, od, quotes) == 0
    on_demand_only = [q for q in quotes if q.pool.market == "on-demand"]
    assert _wait(s, _stopped(60), od, on_demand_only) == 0
    # before the first attempt the wait counts from the job's creation
    fresh = Job(job_id="j", name="j", status=JobStatus.PLACING, created_at=NOW - 10)
    assert _wait(s, fresh, od, quotes) == GANG_FIT_RECHECK_S
    assert _wait(s, fresh, od, quotes, NOW + 30 * 60) == 0


def test_a_plans_view_answers_as_each_quote_asked_alone() -> None:
    """Plan computes the bounds and the spot verdict once (plan_view): the same answers as asking per
    quote, and a verdict given is the one used (spot did not pay: no wait although the job has no evidence)."""
    quotes = [q.model_copy(update={"price_per_hour": 0.91 if q.pool.market == "spot" else 3.06})
              for q in quotes_for(make_spec())]
    view = plan_view(make_spec(), _stopped(60), quotes, NOW)
    answers = [view.saves(q) for q in quotes]
    assert answers == [saves(q, quotes) for q in quotes] and True in answers and False in answers
    unset = _waiting(0).model_copy(update={"recovery": _waiting(0).recovery.model_copy(
        update={"spot_wait_minutes": None})})
    assert wait_left_s(unset, _stopped(60), quotes, NOW, view) > 0  # no evidence yet: the default wait
    told = plan_view(make_spec(), _stopped(60), quotes, NOW, did_not_pay=True)
    assert wait_left_s(unset, _stopped(60), quotes, NOW, told) == 0


@pytest.mark.parametrize("bad", [-1, 7 * 24 * 60 + 1, "soon"])
def test_spot_wait_minutes_is_validated(bad: object) -> None:
    doc = make_spec().model_dump(mode="json")
    doc["recovery"]["spot_wait_minutes"] = bad
    with pytest.raises(ValidationError, match="spot_wait_minutes"):
        JobSpec.model_validate(doc)



def test_the_schema_states_the_unset_wait_plan_uses() -> None:
    """`spotrelay schema` (an editor's hover) said 60 minutes; Plan waits EVIDENCE_WAIT_MINUTES (job-spec.md)."""
    told = JobSpec.model_fields["recovery"].annotation.model_fields["spot_wait_minutes"].description  # type: ignore[union-attr]
    assert f"unset: wait up to {EVIDENCE_WAIT_MINUTES:g} minutes" in (told or "")

def test_spot_pools_that_failed_this_run_are_offered_again_once_no_longer_cooling() -> None:
    """Every spot pool failed a launch this run (excluded) but none cools down any more: the wait
    offers them again instead of waiting for pools it would never offer (the job would sit out the
    whole wait)."""
    s = _waiting(60)
    quotes = _scored(quotes_for(s), 9.0)
    job = _stopped(60).model_copy(update={"excluded_pools": [q.pool.key for q in quotes if q.pool.market == "spot"]})
    plan = _new_gang_plan(s, job, quotes, {}, NOW)
    assert plan.wait_s == 0 and plan.candidates and {c.pool.market for c in plan.candidates} == {"spot"}


def _bounded(minutes: float | None) -> JobSpec:
    doc = make_spec().model_dump(mode="json")
    doc["recovery"]["max_placing_minutes"] = minutes
    return JobSpec.model_validate(doc)


def test_max_placing_minutes_bounds_the_time_without_a_gang() -> None:
    """recovery.max_placing_minutes: Plan fails the job (NoPlacementError, its message) once it has had
    no training gang that long since its last attempt's end, or since its submission before any; a gang
    that trains (an open attempt) is never overdue; unset: no bound; the twin's time scale applies."""
    from spotrelay.services.plan import placing_overdue

    assert placing_overdue(_bounded(None), _stopped(10 * 86400), NOW) is None
    assert placing_overdue(_bounded(60), _stopped(3599), NOW) is None
    why = placing_overdue(_bounded(60), _stopped(3600), NOW)
    assert why == "job j has had no training gang for 60 minutes (recovery.max_placing_minutes 60): " \
                  "no allowed pool took it in time"
    queued = Job(job_id="q", name="q", status=JobStatus.PLACING, created_at=NOW - 7200)
    assert placing_overdue(_bounded(90), queued, NOW) is not None  # never started: from its submission
    training = Job(job_id="t", name="t", status=JobStatus.RUNNING, created_at=NOW - 86400, attempt=1,
                   attempts=[Attempt(number=1, started_at=NOW - 86400)])
    assert placing_overdue(_bounded(1), training, NOW) is None
    assert placing_overdue(_bounded(60), _stopped(36), NOW, time_scale=0.01) is not None  # 60 min = 36 s there
    for bad in (0, -5, 30 * 24 * 60 + 1, "soon"):
        with pytest.raises(ValidationError, match="max_placing_minutes"):
            _bounded(bad)  # type: ignore[arg-type]


def test_a_wait_is_cut_to_end_at_max_placing_minutes() -> None:
    """Plan's wait (for spot, for a cooldown up to hours) ends at the bound, so the Plan after it fails
    the job then, not when the wait would have ended; unbounded, or a launch, is left as it is."""
    from spotrelay.contracts.recovery import LaunchPlan
    from spotrelay.services.plan import within_bound

    waiting = LaunchPlan(candidates=[], launch_ranks=[0, 1], wait_s=4 * 3600)
    assert within_bound(_bounded(60), _stopped(3000), waiting, NOW).wait_s == 600
    assert within_bound(_bounded(60), _stopped(3600), waiting, NOW).wait_s == 1  # due: ask again at once
    assert within_bound(_bounded(600), _stopped(0), waiting, NOW).wait_s == 4 * 3600
    assert within_bound(_bounded(None), _stopped(3000), waiting, NOW) is waiting
    assert within_bound(_bounded(60), _stopped(3000), waiting, NOW, time_scale=0.01).wait_s == 1
    launch = LaunchPlan(candidates=[], launch_ranks=[0, 1])
    assert within_bound(_bounded(60), _stopped(3000), launch, NOW) is launch


def test_a_stated_wait_never_bets_the_stall_budgets_last_gang_on_spot() -> None:
    """One stalled recovery from the budget (spot_evidence.last_chance), a job that states
    spot_wait_minutes still gets on-demand at once: the wait must neither hold the job for spot it will
    not take nor, once every spot pool failed this run, offer those pools again (a job on a stormy
    market then failed at its budget, unfinished, where the default went on-demand and finished)."""
    s = _waiting(60)
    quotes = _scored(quotes_for(s), 9.0)
    last = _stopped(60).model_copy(update={"stalled_recoveries": s.recovery.max_stalled_recoveries})
    plan = _new_gang_plan(s, last, quotes, {}, NOW)
    assert plan.wait_s == 0 and plan.candidates and {c.pool.market for c in plan.candidates} == {"on-demand"}
    failed = last.model_copy(update={"excluded_pools": [q.pool.key for q in quotes if q.pool.market == "spot"]})
    plan = _new_gang_plan(s, failed, quotes, {}, NOW)
    assert plan.wait_s == 0 and {c.pool.market for c in plan.candidates} == {"on-demand"}
    assert {c.pool.market for c in _new_gang_plan(s, _stopped(60), quotes, {}, NOW).candidates} == {"spot"}
