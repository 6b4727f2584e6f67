"""The review backoff (placement/cadence.py): each full review that stays doubles the interval to the
next one, up to 16x review_minutes, never past the moment the review's spot evidence expires; a new
attempt starts again at review_minutes, and a review that finds the prices moved since the last one
keeps the interval. Between full reviews the workflow polls the prices every review_minutes, and a
move brings the full review forward. The same rule in the services, in the ASL's NextReview,
NextReviewMark and NextReviewBackoff states (walked by the simulator's interpreter) and in the
simulator's reviews."""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

import pytest

from spotrelay.contracts.recovery import ReviewBackoff
from spotrelay.contracts.workflow import WorkflowTimings
from spotrelay.domain.models import Attempt, Pool
from spotrelay.placement.cadence import (
    REVIEW_BACKOFF_MAX,
    base_review_s,
    full_review_due,
    kept_mark,
    next_review_s,
    poll_s,
    price_mark,
    prices_moved,
)
from spotrelay.placement.review import EVIDENCE_HOURS, evidence_expires_at, review_spot_hours
from spotrelay.services.review import NOTHING_READ, Decision, next_review_seconds, review_seconds, stay_answer
from spotrelay.sim import controller, moves
from spotrelay.sim.asl import AslError, Await, Walker, load_asl
from spotrelay.sim.runner import simulate
from spotrelay.spec.load import load_spec
from spotrelay.spec.models import JobSpec
from tests.unit.test_sim_calibration import TINY
from tests.unit.test_sim_pinned import CASES


def _spec(review_minutes: float) -> JobSpec:
    spec = load_spec(TINY)
    return spec.model_copy(update={"recovery": spec.recovery.model_copy(update={"review_minutes": review_minutes})})


def test_stays_double_the_interval_up_to_the_cap() -> None:
    seq, current = [], None
    for _ in range(6):
        current = next_review_s(current, 1800, 7 * 24 * 3600)
        seq.append(current)
    assert REVIEW_BACKOFF_MAX == 16
    assert seq == [3600, 7200, 14400, 28800, 28800, 28800]


def test_the_outcome_waits_longest_timeout_bounds_it_and_base_is_the_floor() -> None:
    assert [next_review_s(c, 1800, 5000) for c in (1800, 3600, 5000)] == [3600, 5000, 5000]
    assert next_review_s(60, 1800, 10**6) == 3600  # below the base (review_minutes went up): from the base
    assert next_review_s(14400, 1800, 10**6, max_factor=1) == 1800  # no backoff
    assert next_review_s(14400, 1800, 10**6, changes_in_s=5000.2) == 5001  # an input changes then
    assert next_review_s(14400, 1800, 10**6, changes_in_s=60) == 1800  # but not sooner than the base
    with pytest.raises(ValueError, match="base_s"):
        next_review_s(1800, 0, 10**6)


def _attempt(n: int, market: str, start_h: float, end_h: float | None) -> Attempt:
    return Attempt(number=n, pool=Pool(region="us-east-1", az="us-east-1a", instance_type="p5.48xlarge",
                                       market=market), started_at=start_h * 3600,
                   ended_at=None if end_h is None else end_h * 3600)


def test_the_services_rule_follows_the_spec_and_timings() -> None:
    timings = WorkflowTimings(outcome_timeout_s=40_000)
    assert next_review_seconds(_spec(30), timings, None, [], 0.0) == 3600
    assert next_review_seconds(_spec(30), timings, 28800, [], 0.0) == 28800  # 16 x 30 min
    assert next_review_seconds(_spec(30), WorkflowTimings(outcome_timeout_s=10_000), 7200, [], 0.0) == 10_000
    assert next_review_seconds(_spec(0), timings, 40_000, [], 0.0) == 40_000  # reviews off: the longest timeout
    assert next_review_seconds(_spec(1), None, 960, [], 0.0) == 960  # 16 x 60 s


def test_a_gang_on_on_demand_is_reviewed_again_when_its_spot_evidence_expires() -> None:
    """Two short spot attempts ended 5 h and 4 h ago; the gang runs on on-demand since. The review
    weighs them (review_spot_hours) until the older is EVIDENCE_HOURS old: 7 h from now."""
    now = 10.0 * 3600
    attempts = [_attempt(1, "spot", 4.5, 5.0), _attempt(2, "spot", 5.5, 6.0), _attempt(3, "on-demand", 6.0, None)]
    assert evidence_expires_at(attempts, "on-demand", now) == (5.0 + EVIDENCE_HOURS) * 3600
    assert review_spot_hours(attempts, "on-demand", (5.0 + EVIDENCE_HOURS) * 3600 - 1) is not None
    assert review_spot_hours(attempts, "on-demand", (5.0 + EVIDENCE_HOURS) * 3600 + 1) is None
    assert next_review_seconds(_spec(30), None, 28800, attempts, now) == 7 * 3600  # not 16 x 30 min
    assert next_review_seconds(_spec(30), None, 3600, attempts, now) == 7200  # (the doubling is sooner)
    on_spot = [*attempts[:2], _attempt(3, "spot", 6.0, None)]
    assert evidence_expires_at(on_spot, "spot", now) is None  # on spot the evidence does not expire
    assert next_review_seconds(_spec(30), None, 28800, on_spot, now) == 28800
    assert evidence_expires_at(attempts[1:], "on-demand", now) is None  # one attempt is no evidence


def _walker(review: dict[str, Any]) -> tuple[Walker, list[dict[str, Any]]]:
    calls: list[dict[str, Any]] = []

    def on_review(payload: dict[str, Any]) -> dict[str, Any]:
        calls.append(payload)
        return review

    handlers = {"fn_sfn_plan": lambda p: {"candidates": []},
                "fn_sfn_provision": lambda p: {"attempt": 1 + len(calls), "review_s": 1800, "review_mark": None,
                                               "review_backoff": None},
                "fn_sfn_review": on_review}
    return Walker(load_asl(), handlers, {"job_id": "j", "timings": {"ready_timeout_s": 7}}), calls


def test_the_asl_waits_the_reviews_interval_after_a_stay_and_the_base_after_a_move() -> None:
    backoff = {"due": 5400.0, "gap_s": 3600}
    walker, calls = _walker({"outcome": "ready", "review_s": 1200, "review_mark": "m1", "review_backoff": backoff})
    assert walker.advance() == Await("ready", 7.0)
    assert walker.resume({"outcome": "ready"}) == Await("outcome", 1800.0)
    assert walker.resume(error="States.Timeout") == Await("outcome", 1200.0)  # NextReview copied it
    assert calls[-1]["review_s"] == 1800 and calls[-1]["review_mark"] is None  # a new attempt: no mark yet
    assert calls[-1]["review_backoff"] is None  # nor a backoff: its first review is a full one
    assert walker.visited[-5:] == ["Reviewed", "NextReview", "NextReviewMark", "NextReviewBackoff", "WaitOutcome"]
    walker.resume(error="States.Timeout")
    assert calls[-1]["review_s"] == 1200  # the Review task is told the interval that just ended
    assert calls[-1]["review_mark"] == "m1"  # the mark of the prices the last full Review read
    assert calls[-1]["review_backoff"] == backoff  # and when the next full one is due

    moving, _ = _walker({"outcome": "migrate", "attempt": 1})
    moving.advance()
    moving.resume({"outcome": "ready"})
    assert moving.resume(error="States.Timeout") == Await("ready", 7.0)  # Migrate: a new attempt
    assert moving.data["launch"]["review_s"] == 1800 and "NextReview" not in moving.visited


def test_the_interpreter_refuses_input_processing_it_does_not_implement() -> None:
    asl = load_asl()
    asl["States"]["Review"] = {**asl["States"]["Review"], "ResultSelector": {"x.$": "$"}}
    with pytest.raises(AslError, match="ResultSelector"):
        Walker(asl, {}, {})


def _recorded(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int, float, dict[str, Any], dict[str, Any]]]:
    """Every simulated Review: (run, attempt, clock, payload, answer)."""
    seen: list[tuple[int, int, float, dict[str, Any], dict[str, Any]]] = []
    original = controller.SpotrelayRun.task_review

    def recorded(self: controller.SpotrelayRun, payload: dict[str, Any]) -> dict[str, Any]:
        out = original(self, payload)
        seen.append((id(self), self.attempt, self.now, payload, out))
        return out

    monkeypatch.setattr(controller.SpotrelayRun, "task_review", recorded)
    return seen


@pytest.mark.parametrize("skip", [True, False])
def test_the_simulators_reviews_back_off_as_the_rule_says(monkeypatch: pytest.MonkeyPatch, skip: bool) -> None:
    """32 nodes on the g4dn trace: parked on on-demand, prices that never move. Each full review's backoff
    doubles the last; the polls between come every review_minutes and land on its due time; the first
    review of an attempt comes after review_minutes and is a full one. Walking every poll
    (``SKIP_POLLS`` False) or stepping over the idle ones: the same full reviews at the same times."""
    monkeypatch.setattr(moves, "SKIP_POLLS", skip)
    seen = _recorded(monkeypatch)
    simulate(CASES["g4dn-32"])
    stays = [s for s in seen if s[4]["outcome"] == "ready"]
    fulls = [s for s in stays if s[4]["review_backoff"] != s[3]["review_backoff"]]
    assert len(fulls) >= 8 and max(s[4]["review_backoff"]["gap_s"] for s in fulls) == 28800
    ceiling = WorkflowTimings().outcome_timeout_s
    for s in fulls:  # (a 32-node gang never trains on spot here: no evidence to expire)
        last = s[3]["review_backoff"]
        gap = next_review_s(None if last is None else last["gap_s"], 1800, ceiling)
        assert s[4]["review_backoff"] == {"due": s[2] + gap, "gap_s": gap}
        assert last is None or s[2] >= last["due"] - 1  # prices that never move: never before it is due
    for s in stays:
        assert s[4]["review_s"] == poll_s(1800, s[4]["review_backoff"]["due"], s[2]) == 1800
    polls = [s for s in stays if s not in fulls]
    assert bool(polls) is not skip  # (stepping over them: no idle poll walked)
    for prev, cur in itertools.pairwise(seen):
        if prev[:2] == cur[:2] and prev[4]["outcome"] == "ready":
            # the next poll, or (stepping over the idle ones) the first that is due
            full = prev[4]["review_backoff"] != prev[3]["review_backoff"]
            after = prev[4]["review_backoff"]["gap_s"] if skip and full else prev[4]["review_s"]
            assert cur[2] - prev[2] == pytest.approx(after)
            assert cur[3]["review_backoff"] == prev[4]["review_backoff"]  # NextReviewBackoff carried it


def test_a_new_attempt_is_reviewed_after_review_minutes_capped_by_the_outcome_timeout() -> None:
    assert base_review_s(30, 86_400) == 1800
    assert base_review_s(0.001, 86_400) == 1  # never a zero timeout
    assert base_review_s(600, 3600) == 3600  # never past the outcome wait's longest timeout
    assert base_review_s(0, 3600) == 3600  # reviews off: only the timeout
    assert review_seconds(_spec(30), WorkflowTimings(outcome_timeout_s=900)) == 900
    assert review_seconds(_spec(30), None) == 1800


def test_the_review_prices_a_move_at_the_computes_boot_in_modeled_time(tmp_path: Any) -> None:
    """The twin's compute answers its boot on the twin's clock (300 s modeled -> 3 s at time_scale 0.01);
    the review's move cost is in modeled hours, so it divides the scale back out. EC2 (scale 1) is as is."""
    from spotrelay.adapters.memory_job_store import MemoryJobStore
    from spotrelay.local.compute import LocalCompute
    from spotrelay.local.market import MarketModel
    from spotrelay.services.controller import Controller
    from spotrelay.services.review import _modeled_boot

    pool = Pool(region="us-east-1", az="us-east-1a", instance_type="p5.48xlarge", market="spot")
    compute = LocalCompute(MarketModel(regions=["us-east-1"], boot_time_s=300, time_scale=0.01), tmp_path)
    ctl = Controller(store=MemoryJobStore(), compute=compute)
    assert compute.expected_boot_s(pool) == pytest.approx(3.0)
    boot = _modeled_boot(ctl, 0.01)
    assert boot is not None and boot(pool) == pytest.approx(300.0)
    assert _modeled_boot(Controller(store=MemoryJobStore()), 1.0) is None  # no compute: ReviewConfig's 5 min


def test_the_price_mark_changes_with_a_price_move_and_not_with_a_tick_or_order() -> None:
    a = price_mark([("us-east-1/us-east-1a/p5.48xlarge/spot", 22.0161), ("us-east-1/us-east-1a/p5.48xlarge/on-demand",
                                                                          55.04)])
    assert a == price_mark(reversed([("us-east-1/us-east-1a/p5.48xlarge/spot", 22.0161),
                                     ("us-east-1/us-east-1a/p5.48xlarge/on-demand", 55.04)]))
    assert a != price_mark([("us-east-1/us-east-1a/p5.48xlarge/spot", 22.6),
                            ("us-east-1/us-east-1a/p5.48xlarge/on-demand", 55.04)])
    assert a != price_mark([("us-east-1/us-east-1a/p5.48xlarge/spot", 22.0161)])  # a pool gone
    assert price_mark([("k", 22.0161)]) == price_mark([("k", 22.0162)])  # a tick: no move
    for price in (0.5, 3.06, 22.0161, 98.32, 1234.5):  # a move of 2% always counts, either way
        assert price_mark([("k", price)]) != price_mark([("k", price * 1.02)])
        assert price_mark([("k", price)]) != price_mark([("k", price / 1.02)])
    for odd in (0.0, -1.0, float("nan"), float("inf")):  # not a price: written as it is, never an error
        assert len(price_mark([("k", odd)])) == 16
    assert price_mark([("k", 0.0)]) != price_mark([("k", float("nan"))])
    assert len(a) == 16 and price_mark([]) == price_mark([])
    assert prices_moved("a", "b") and not prices_moved("a", "a")
    assert not prices_moved("a", None) and not prices_moved(None, "a")  # nothing to compare
    assert kept_mark(None, "last") == "last" and kept_mark("now", "last") == "now"


def test_a_review_that_finds_the_prices_moved_keeps_the_interval() -> None:
    assert next_review_s(14400, 1800, 10**6, moved=True) == 14400
    assert next_review_s(None, 1800, 10**6, moved=True) == 1800
    assert next_review_s(60, 1800, 10**6, moved=True) == 1800  # never below the base
    assert next_review_s(14400, 1800, 5000, moved=True) == 5000  # (the outcome wait's longest timeout)
    assert next_review_s(14400, 1800, 10**6, changes_in_s=5000.2, moved=True) == 5001  # (evidence expiry)
    timings, spec = WorkflowTimings(), _spec(30)
    last = ReviewBackoff(due=10_000.0, gap_s=7200)
    still = stay_answer(spec, timings, 3, "no better placement", [], 10_000.0, Decision(None, "m1", True), "m1", last)
    assert (still.review_s, still.review_mark, still.attempt) == (1800, "m1", 3)
    assert still.review_backoff == ReviewBackoff(due=10_000.0 + 14400, gap_s=14400)  # doubled
    moved = stay_answer(spec, timings, 3, "no better placement", [], 9_000.0, Decision(None, "m2", True), "m1", last)
    assert (moved.review_mark, moved.review_backoff) == ("m2", ReviewBackoff(due=9_000.0 + 7200, gap_s=7200))
    poll = stay_answer(spec, timings, 3, "prices hold", [], 9_000.0, Decision(None, "m1"), "m1", last)
    assert (poll.review_s, poll.review_mark, poll.review_backoff) == (1000, "m1", last)  # lands on the due time
    blind = stay_answer(spec, timings, 3, "stale", [], 9_000.0, NOTHING_READ, "m1", last)  # read no prices
    assert (blind.review_s, blind.review_mark, blind.review_backoff) == (1000, "m1", last)
    late = stay_answer(spec, timings, 3, "stale", [], 12_000.0, NOTHING_READ, "m1", last)  # due passed, untrained
    assert (late.review_s, late.review_backoff) == (1800, last)  # polls on; the next full review is due at once
    first = stay_answer(spec, timings, 3, "no better placement", [], 0.0, Decision(None, "m1", True), None, None)
    assert (first.review_s, first.review_mark) == (1800, "m1")
    assert first.review_backoff == ReviewBackoff(due=3600, gap_s=3600)
    # an execution of an older definition (no backoff passed): review_s is the backoff, as it was
    legacy = stay_answer(spec, timings, 3, "no better placement", [], 0.0, Decision(None, "m1", True), "m1", None,
                         current_s=7200, polls=False)
    assert (legacy.review_s, legacy.review_mark, legacy.review_backoff) == (14400, "m1", None)
    legacy_moved = stay_answer(spec, timings, 3, "no better placement", [], 0.0, Decision(None, "m2", True), "m1",
                               None, current_s=7200, polls=False)
    assert legacy_moved.review_s == 7200


def test_a_poll_is_a_full_review_when_due_or_when_the_prices_moved() -> None:
    assert full_review_due(0.0, None, "m", "m")  # the first review of an attempt
    assert not full_review_due(100.0, 200.0, "m", "m") and full_review_due(100.0, 200.0, "n", "m")
    assert full_review_due(199.5, 200.0, "m", "m") and full_review_due(500.0, 200.0, "m", "m")  # (a rounding second)
    assert not full_review_due(100.0, 200.0, None, "m")  # read no prices: nothing moved
    assert poll_s(1800, None, 0.0) == 1800 and poll_s(1800, 10_000.0, 0.0) == 1800
    assert poll_s(1800, 1000.5, 0.0) == 1001 and poll_s(1800, 1000.0, 999.5) == 1800  # due: polls on
    assert poll_s(1800, 1000.0, 5000.0) == 1800  # past due (a gang that was not training): never a 1 s loop


def test_the_simulators_full_reviews_come_when_due_or_after_a_price_move(monkeypatch: pytest.MonkeyPatch) -> None:
    """32 nodes on the synthetic market (a new price every 6 h): each full review that stays carries the mark
    of the market's prices then; its backoff is the last one's interval where they moved since the last full
    review, else doubled; and a price move is seen by the first poll after it, not at the end of the backoff
    (every poll walked: ``SKIP_POLLS`` False)."""
    monkeypatch.setattr(moves, "SKIP_POLLS", False)
    seen = _recorded(monkeypatch)
    simulate(CASES["synthetic-32"])
    stays = [s for s in seen if s[4]["outcome"] == "ready" and s[3]["attempt"] == s[1]]
    ceiling = WorkflowTimings().outcome_timeout_s
    held = early = polls = 0
    for _, _, now, payload, out in stays:
        last = payload["review_backoff"]
        if out["review_backoff"] == last:  # a poll that stayed: same prices before its due time, or none read
            assert last is not None and out["review_mark"] == payload["review_mark"]
            polls += 1
            continue
        moved = payload["review_mark"] not in (None, out["review_mark"])
        gap = next_review_s(last and last["gap_s"], 1800, ceiling, moved=moved)
        assert out["review_backoff"] == {"due": now + gap, "gap_s": gap}
        held += moved and last["gap_s"] < 28800
        early += moved and now < last["due"] - 1  # brought forward by the move
    assert held >= 3 and early >= 3 and polls > len(stays) / 2  # (most polls read the same prices)
    for prev, cur in itertools.pairwise(seen):
        if prev[:2] == cur[:2] and prev[4]["outcome"] == "ready":
            assert cur[3]["review_mark"] == prev[4]["review_mark"]  # NextReviewMark carried it
            assert cur[3]["review_backoff"] == prev[4]["review_backoff"]  # and NextReviewBackoff
            assert cur[2] - prev[2] <= 1800 + 1e-6  # polls every review_minutes at most


def test_stepping_over_idle_polls_changes_no_decision(monkeypatch: pytest.MonkeyPatch) -> None:
    """The simulator steps over polls that read the same prices before their due time (moves.next_poll_at);
    walking every one of them gives every run the same figures, on a market whose prices move and on a
    trace, for a fixed and an elastic gang."""
    from spotrelay.sim.runner import SimOptions

    for name in ("synthetic-32", "synthetic-16-switches", "g4dn-16-elastic", "g4dn-16-all"):
        opts: SimOptions = CASES[name]
        figures = []
        for skip in (True, False):
            monkeypatch.setattr(moves, "SKIP_POLLS", skip)
            report = simulate(opts)
            figures.append([(r.policy, r.values, r.finished) for r in report.runs])
        assert figures[0] == figures[1], name


@pytest.mark.parametrize("overrides", [{}, {"resources": {"markets": ["on-demand"]}},
                                       {"resources": {"regions": ["us-east-1"], "instance_types": ["p4d.24xlarge"]}}])
def test_the_simulators_price_mark_is_the_one_review_decide_computes(overrides: dict[str, Any]) -> None:
    """review.decide marks every quote the MarketData port gives for the spec's regions, instance types
    and markets; the simulator's mark (kept until a price changes) is the same over a run's slots."""
    from spotrelay.sim import moves
    from spotrelay.sim.build import build_market
    from spotrelay.sim.runner import make_run

    opts = CASES["synthetic-32"]
    market = build_market(opts.market, 0)
    switches = {"spec_overrides": overrides} if overrides else {}
    run = make_run("spotrelay", replace(opts, spotrelay_switches=switches), market, 0, 0.0)
    res = run.spec.resources  # type: ignore[attr-defined]
    markets = [m.value for m in res.markets]
    marks = set()
    for hour in (0.0, 1.0, 5.99, 6.0, 6.5, 30.0, 30.0, 47.9):
        run.now = hour * 3600.0
        quotes = [q for q in run.market.quotes(run.now) if q.pool.market in markets
                  and q.pool.region in res.regions and q.pool.instance_type in res.instance_types]
        want = price_mark((q.pool.key, q.price_per_hour) for q in quotes)
        assert moves._price_mark(run) == want  # type: ignore[arg-type]
        marks.add(want)
    assert len(marks) == (1 if overrides.get("resources", {}).get("markets") == ["on-demand"] else 4)  # 4 slots


@pytest.mark.parametrize("bad", [{"due": "soon", "gap_s": 60}, {"due": -1.0, "gap_s": 60}, {"due": 10.0, "gap_s": 0},
                                 {"due": float("nan"), "gap_s": 60}, {"due": 10.0}, {"due": 1.0, "gap_s": 60, "x": 1},
                                 [1, 2], "tomorrow", 7])
def test_a_hostile_review_backoff_is_refused_naming_the_field(bad: Any) -> None:
    """The Review task's payload comes from the workflow; anything else in ``review_backoff`` is an error
    that names it (the execution then fails through its Catch), never a backoff read wrongly."""
    from pydantic import ValidationError

    from spotrelay.services.task_payloads import ReviewTask

    with pytest.raises(ValidationError, match="review_backoff"):
        ReviewTask.model_validate({"job_id": "j", "attempt": 1, "review_backoff": bad})
    ok = ReviewTask.model_validate({"job_id": "j", "attempt": 1, "review_backoff": {"due": 10.5, "gap_s": 60}})
    assert ok.polls and ok.review_backoff == ReviewBackoff(due=10.5, gap_s=60)
    assert ReviewTask.model_validate({"job_id": "j", "attempt": 1, "review_backoff": None}).polls  # a new attempt
    assert not ReviewTask.model_validate({"job_id": "j", "attempt": 1}).polls  # an older definition
