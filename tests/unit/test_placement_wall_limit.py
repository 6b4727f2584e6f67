"""recovery.max_slowdown (placement/spot_evidence.WallLimit): a job keeps a schedule of on-demand's wall
time x the limit; behind it, Plan gives spot up and a review keeps it on on-demand until it is on
schedule again."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from spotrelay.domain.models import Attempt
from spotrelay.placement import spot_evidence as se
from spotrelay.services.plan import _new_gang_plan
from spotrelay.spec.models import JobSpec
from tests.unit.test_placement_gang_fit import _scored
from tests.unit.test_placement_policy import NOW, make_spec, quotes_for
from tests.unit.test_placement_spot_evidence import OD, SPOT, H, _job, _od_quotes

ELAPSED_H = 10.0  # the job's first attempt started this long before NOW


def _spec(max_slowdown: float | None) -> JobSpec:
    doc = make_spec().model_dump(mode="json")  # 4 nodes; the cheapest on-demand per unit of work is p5
    doc["recovery"]["max_slowdown"] = max_slowdown
    return JobSpec.model_validate(doc)


def _history(done: int, first_step: int = 0) -> list[Attempt]:
    """One spot gang of the job's 4 p5 nodes that started ELAPSED_H ago and committed ``done`` steps at 100
    steps an hour (what a full on-demand p5 gang trains too), then a reclaim half an hour ago."""
    start = NOW - ELAPSED_H * H
    resumed = start + 0.2 * H
    return [Attempt(number=1, pool=SPOT, started_at=start, ended_at=NOW - 0.5 * H, end_reason="interrupted",
                    nodes=4, world_size=4, cost=10.0, resumed_from_step=first_step, resumed_at=resumed,
                    saved_step=first_step + done, saved_at=resumed + done / 100 * H)]


def test_the_schedule_is_on_demands_training_hours_times_the_limit() -> None:
    wall = se.wall_limit(_spec(2.0))
    assert wall == se.WallLimit(2.0, 4, lag_minutes=20) and se.wall_limit(_spec(None)) is None
    quotes = _od_quotes()
    # 10 h in at 2x: 5 h of full on-demand training due (500 steps)
    assert wall.hours_behind(_history(350), quotes, NOW) == pytest.approx(1.5)
    assert wall.hours_behind(_history(520), quotes, NOW) == pytest.approx(-0.2)
    # a job resumed from another's checkpoint counts its own steps only
    assert wall.hours_behind(_history(350, first_step=5000), quotes, NOW) == pytest.approx(1.5)
    # the schedule is the spec's full gang on on-demand: 8 nodes would have trained those steps in half the time
    assert se.WallLimit(2.0, 8).hours_behind(_history(350), quotes, NOW) == pytest.approx(5.0 - 1.75)


def test_the_grace_grows_by_the_steps_the_trainers_have_not_saved_yet() -> None:
    """Committed steps trail training by up to one checkpoint interval: a job saving hourly is not
    behind for that hour."""
    quotes = _od_quotes()
    late = _history(350)  # 1.5 h behind
    assert se.WallLimit(2.0, 4).behind(late, quotes, NOW)
    assert not se.WallLimit(2.0, 4, lag_minutes=60).behind(late, quotes, NOW)
    assert not se.WallLimit(2.0, 4, lag_steps=100).behind(late, quotes, NOW)  # 100 steps: an hour on on-demand
    assert se.WallLimit(2.0, 4, lag_steps=20).behind(late, quotes, NOW)
    doc = make_spec().model_dump(mode="json")
    doc["recovery"]["max_slowdown"] = 2.0
    assert se.wall_limit(JobSpec.model_validate(doc)) == se.WallLimit(2.0, 4, lag_minutes=20)  # every_minutes 20
    doc["checkpoint"] = {"every_minutes": "auto", "auto_max_minutes": 45}
    assert se.wall_limit(JobSpec.model_validate(doc)) == se.WallLimit(2.0, 4, lag_minutes=45)
    doc["checkpoint"] = {"every_steps": 50}
    assert se.wall_limit(JobSpec.model_validate(doc)) == se.WallLimit(2.0, 4, lag_steps=50)


def test_behind_by_more_than_the_grace_gives_spot_up_and_on_schedule_lets_it_back() -> None:
    wall = se.WallLimit(2.0, 4)
    quotes = _od_quotes()
    behind, close, ahead = _history(350), _history(450), _history(520)  # 1.5 h, 0.5 h behind; 0.2 h ahead
    assert 0.5 < se.SCHEDULE_GRACE_HOURS < 1.5
    assert wall.behind(behind, quotes, NOW) and not wall.behind(close, quotes, NOW)
    assert not wall.on_schedule(close, quotes, NOW) and wall.on_schedule(ahead, quotes, NOW)
    # Plan's verdict: spot did not pay when behind, whatever it cost (one attempt: no cost verdict yet)
    assert se.spot_did_not_pay(behind, quotes, NOW, wall=wall)
    assert not se.spot_did_not_pay(behind, quotes, NOW)  # without the limit, cost alone decides
    assert not se.spot_did_not_pay(close, quotes, NOW, wall=wall)
    # the review's move back to spot waits until the job is on schedule
    on_od = [*close, Attempt(number=2, pool=OD, started_at=NOW - 0.4 * H)]
    assert not se.off_on_demand_allowed("spot", "on-demand", on_od, quotes, NOW, wall=wall)
    assert se.off_on_demand_allowed("spot", "on-demand", on_od, quotes, NOW)
    assert se.off_on_demand_allowed("spot", "on-demand", [*ahead, on_od[-1]], quotes, NOW, wall=wall)
    assert se.off_on_demand_allowed("on-demand", "on-demand", on_od, quotes, NOW, wall=wall)  # not a move to spot


def test_no_schedule_before_a_measured_step_or_without_on_demand() -> None:
    wall = se.WallLimit(1.5, 4)
    unmeasured = [a.model_copy(update={"saved_step": None, "saved_at": None}) for a in _history(350)]
    assert wall.hours_behind(unmeasured, _od_quotes(), NOW) is None
    assert not wall.behind(unmeasured, _od_quotes(), NOW) and wall.on_schedule(unmeasured, _od_quotes(), NOW)
    spot_only = [q for q in quotes_for(make_spec()) if q.pool.market == "spot"]
    assert wall.hours_behind(_history(350), spot_only, NOW) is None
    assert wall.hours_behind([], _od_quotes(), NOW) is None


def test_the_schedule_counts_from_the_submission_not_the_first_launch() -> None:
    """A wait for capacity before the first launch is wall time the user waits too: a job submitted 2 h
    before its first gang started is 1 h further behind at a limit of 2."""
    quotes = _od_quotes()
    close = _history(450)  # 0.5 h behind from the first start: within the grace
    waited = se.WallLimit(2.0, 4, since=NOW - (ELAPSED_H + 2.0) * H)
    assert se.WallLimit(2.0, 4).hours_behind(close, quotes, NOW) == pytest.approx(0.5)
    assert waited.hours_behind(close, quotes, NOW) == pytest.approx(1.5) and waited.behind(close, quotes, NOW)
    # a record without a creation time (0.0, the model's default) or one after the first start: the first start
    assert se.WallLimit(2.0, 4, since=0.0).hours_behind(close, quotes, NOW) == pytest.approx(0.5)
    assert se.WallLimit(2.0, 4, since=NOW).hours_behind(close, quotes, NOW) == pytest.approx(0.5)
    assert se.wall_limit(_spec(2.0), NOW - H) == se.WallLimit(2.0, 4, lag_minutes=20, since=NOW - H)
    # Plan reads the job record's created_at
    scored = _scored(quotes_for(make_spec()), 9.0)
    submitted = _job(close).model_copy(update={"created_at": NOW - (ELAPSED_H + 2.0) * H})
    assert not se.spot_given_up(_spec(2.0), close, 0, scored, NOW)
    assert se.spot_given_up(_spec(2.0), close, 0, scored, NOW, since=submitted.created_at)
    plan = _new_gang_plan(_spec(2.0), submitted, scored, {}, NOW)
    assert {c.pool.market for c in plan.candidates} == {"on-demand"}
    assert _new_gang_plan(_spec(2.0), _job(close), scored, {}, NOW).candidates[0].pool.market == "spot"


def test_plan_places_a_job_behind_its_schedule_on_on_demand() -> None:
    quotes = _scored(quotes_for(make_spec()), 9.0)  # every spot pool holds the gang
    assert se.spot_given_up(_spec(2.0), _history(350), 0, quotes, NOW)
    assert not se.spot_given_up(_spec(None), _history(350), 0, quotes, NOW)
    behind = _new_gang_plan(_spec(2.0), _job(_history(350)), quotes, {}, NOW)
    assert behind.wait_s == 0 and {c.pool.market for c in behind.candidates} == {"on-demand"}
    unlimited = _new_gang_plan(_spec(None), _job(_history(350)), quotes, {}, NOW)
    assert unlimited.candidates[0].pool.market == "spot"
    on_time = _new_gang_plan(_spec(2.0), _job(_history(450)), quotes, {}, NOW)
    assert on_time.candidates[0].pool.market == "spot"


@pytest.mark.parametrize("value", [0.5, 0.99, 101, "nan", "inf", "fast"])
def test_a_bad_max_slowdown_is_refused_naming_the_field(value: object) -> None:
    doc = make_spec().model_dump(mode="json")
    doc["recovery"]["max_slowdown"] = value
    with pytest.raises(ValidationError, match="max_slowdown"):
        JobSpec.model_validate(doc)


def test_a_review_catches_up_a_spot_or_shrunk_gang_on_on_demand_at_the_full_size() -> None:
    from spotrelay.placement.review import catch_up

    spec = make_spec()  # 4 nodes
    quotes = quotes_for(spec)
    spot = next(q for q in quotes if q.pool.market == "spot")
    on_demand = next(q for q in quotes if q.pool.market == "on-demand")
    move = catch_up(spec, spot, 4, quotes, {}, NOW, 2.5)
    assert move is not None and move.target.pool.market == "on-demand" and move.target.nodes == 4
    assert not move.in_place and move.move_cost > 0
    assert move.reason.startswith("review: 2.5 h behind the schedule of recovery.max_slowdown on " + spot.pool.key)
    shrunk = catch_up(spec, on_demand, 2, quotes, {}, NOW, 1.5)  # an elastic gang at half size
    assert shrunk is not None and shrunk.target.nodes == 4
    assert catch_up(spec, on_demand, 4, quotes, {}, NOW, 1.5) is None  # on the schedule's own gang already
    assert catch_up(spec, spot, 4, [q for q in quotes if q.pool.market == "spot"], {}, NOW, 1.5) is None


def test_describe_says_where_the_job_stands_against_its_schedule() -> None:
    from spotrelay.adapters.static_market import StaticMarketData
    from spotrelay.services.describe import describe_job

    market = StaticMarketData()

    def line(limit: float | None, done: int, attempts: list[Attempt] | None = None) -> str | None:
        job = _job(_history(done) if attempts is None else attempts).model_copy(
            update={"spec": _spec(limit).model_dump(mode="json")})
        return describe_job(job, [], NOW, market=market).schedule

    assert line(None, 350) is None  # no limit: no line
    assert line(2.0, 350) == ("schedule (recovery.max_slowdown 2): 1.5 h behind: its gang goes on on-demand "
                              "until it is on schedule again")
    assert line(2.0, 450) == ("schedule (recovery.max_slowdown 2): 0.5 h behind, within the grace (1 h and the "
                              "steps not saved yet)")
    assert line(2.0, 520) == "schedule (recovery.max_slowdown 2): 0.2 h of on-demand training ahead"
    assert line(1.5, 0, []).endswith("not measured yet (no committed step, or no on-demand pool allowed)")
    submitted = _job(_history(450)).model_copy(update={"spec": _spec(2.0).model_dump(mode="json"),
                                                        "created_at": NOW - (ELAPSED_H + 2.0) * H})
    assert describe_job(submitted, [], NOW, market=market).schedule == (  # from the submission, 2 h earlier
        "schedule (recovery.max_slowdown 2): 1.5 h behind: its gang goes on on-demand until it is on schedule again")
    assert describe_job(_job(_history(350)).model_copy(update={"spec": _spec(2.0).model_dump(mode="json")}),
                        [], NOW).schedule is None  # (no market given: no line)


def test_a_full_review_of_a_job_behind_its_schedule_does_not_back_off() -> None:
    from spotrelay.services.review import Decision, review_seconds, stay_fields

    spec = _spec(1.5)
    base = review_seconds(spec, None)
    last = {"due": NOW, "gap_s": 4 * base}  # three full reviews stayed before
    calm = stay_fields(spec, None, [], NOW, Decision(None, "m", True), "m", last)
    assert calm["review_backoff"]["gap_s"] > 4 * base  # doubled again
    behind = stay_fields(spec, None, [], NOW, Decision(None, "m", True, keep_pace=True), "m", last)
    assert behind["review_backoff"] == {"due": NOW + base, "gap_s": base}


def test_describe_tells_a_slow_job_without_a_limit_of_max_slowdown() -> None:
    from spotrelay.adapters.static_market import StaticMarketData
    from spotrelay.services.describe import SLOW_ADVICE_FACTOR, describe_job

    def advice(limit: float | None, done: int, now: float = NOW) -> list[str]:
        job = _job(_history(done)).model_copy(update={"spec": _spec(limit).model_dump(mode="json")})
        return [a for a in describe_job(job, [], now, market=StaticMarketData()).advice if "max_slowdown" in a]

    # 10 h in, 350 steps: 3.5 h of full on-demand training
    assert advice(None, 350) == ["its committed training took 2.9x the wall time a full on-demand gang would have "
                                 "(10.0 h for 3.5 h of it): recovery.max_slowdown keeps a job within a stated "
                                 "multiple of that, mixing on-demand in (docs/placement.md, \"A schedule\")"]
    assert advice(None, int(1000 / SLOW_ADVICE_FACTOR) + 10) == []  # under the factor
    assert advice(2.0, 350) == []  # the limit is set: the schedule line says where it stands
    assert advice(None, 100, NOW - 5 * H) == []  # 5 h in: too early to say
    on_demand_only = _job([a.model_copy(update={"pool": OD}) for a in _history(350)]).model_copy(
        update={"spec": _spec(None).model_dump(mode="json")})
    assert not [a for a in describe_job(on_demand_only, [], NOW, market=StaticMarketData()).advice
                if "max_slowdown" in a]  # not spot's doing


def test_a_limit_without_on_demand_allowed_is_refused_before_a_launch() -> None:
    from spotrelay.spec.checks import launch_problems

    doc = _spec(1.5).model_dump(mode="json")
    assert not [p for p in launch_problems(JobSpec.model_validate(doc)) if p[0] == "recovery.max_slowdown"]
    doc["resources"]["markets"] = ["spot"]
    assert [p[0] for p in launch_problems(JobSpec.model_validate(doc))] == ["recovery.max_slowdown"]
