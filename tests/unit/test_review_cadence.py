"""The review backoff (placement/cadence.py): each review that stays doubles the next interval, up to
16x review_minutes, never past the moment the review's spot evidence expires; a new attempt starts
again at review_minutes, and so does a review that finds the prices moved since the last one. The same
rule in the services, in the ASL's NextReview and NextReviewMark states (walked by the simulator's
interpreter) and in the simulator's reviews."""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

import pytest

from spotrelay.contracts.workflow import WorkflowTimings
from spotrelay.domain.models import Attempt, Pool
from spotrelay.placement.cadence import (
    REVIEW_BACKOFF_MAX,
    base_review_s,
    kept_mark,
    next_review_s,
    price_mark,
    prices_moved,
)
from spotrelay.placement.review import EVIDENCE_HOURS, evidence_expires_at, review_spot_hours
from spotrelay.services.review import next_review_seconds, review_seconds, stay_answer
from spotrelay.sim import controller
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
                "fn_sfn_provision": lambda p: {"attempt": 1 + len(calls), "review_s": 1800, "review_mark": None},
                "fn_sfn_review": on_review}
    return Walker(load_asl(), handlers, {"job_id": "j", "timings": {"ready_timeout_s": 7}}), calls


def test_the_asl_waits_the_reviews_interval_after_a_stay_and_the_base_after_a_move() -> None:
    walker, calls = _walker({"outcome": "ready", "review_s": 3600, "review_mark": "m1"})
    assert walker.advance() == Await("ready", 7.0)
    assert walker.resume({"outcome": "ready"}) == Await("outcome", 1800.0)
    assert walker.resume(error="States.Timeout") == Await("outcome", 3600.0)  # NextReview copied it
    assert calls[-1]["review_s"] == 1800 and calls[-1]["review_mark"] is None  # a new attempt: no mark yet
    assert walker.visited[-4:] == ["Reviewed", "NextReview", "NextReviewMark", "WaitOutcome"]
    walker.resume(error="States.Timeout")
    assert calls[-1]["review_s"] == 3600  # the Review task is told the interval that just ended
    assert calls[-1]["review_mark"] == "m1"  # and the mark of the prices the last Review read

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


def test_the_simulators_reviews_back_off_as_the_rule_says(monkeypatch: pytest.MonkeyPatch) -> None:
    """32 nodes on the g4dn trace: parked on on-demand. Each review comes the interval the previous
    stay returned after it; the first review of an attempt comes after review_minutes."""
    seen: list[tuple[int, int, float, dict[str, Any], dict[str, Any]]] = []
    original = controller.SpotrelayRun.task_review

    def recorded(self: controller.SpotrelayRun, payload: dict[str, Any]) -> dict[str, Any]:
        out = original(self, payload)
        seen.append((id(self), self.attempt, self.now, payload, out))
        return out

    monkeypatch.setattr(controller.SpotrelayRun, "task_review", recorded)
    simulate(CASES["g4dn-32"])
    stays = [s for s in seen if s[4]["outcome"] == "ready"]
    assert len(stays) >= 8 and max(s[4]["review_s"] for s in stays) == 28800
    for s in stays:  # (a 32-node gang never trains on spot here: no evidence to expire)
        assert s[4]["review_s"] == next_review_s(s[3]["review_s"], 1800, WorkflowTimings().outcome_timeout_s)
    for prev, cur in itertools.pairwise(seen):
        if prev[:2] == cur[:2] and prev[4]["outcome"] == "ready":
            assert cur[2] - prev[2] == pytest.approx(prev[4]["review_s"])
            assert cur[3]["review_s"] == prev[4]["review_s"]


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
    timings = WorkflowTimings()
    still = stay_answer(_spec(30), timings, 3, "no better placement", 7200, [], 0.0, "m1", "m1")
    assert (still.review_s, still.review_mark, still.attempt) == (14400, "m1", 3)
    moved = stay_answer(_spec(30), timings, 3, "no better placement", 7200, [], 0.0, "m2", "m1")
    assert (moved.review_s, moved.review_mark) == (7200, "m2")
    blind = stay_answer(_spec(30), timings, 3, "stale", 7200, [], 0.0, None, "m1")  # read no prices
    assert (blind.review_s, blind.review_mark) == (14400, "m1")
    first = stay_answer(_spec(30), timings, 3, "no better placement", 1800, [], 0.0, "m1", None)
    assert (first.review_s, first.review_mark) == (3600, "m1")


def test_the_simulators_reviews_hold_their_interval_when_the_prices_move(monkeypatch: pytest.MonkeyPatch) -> None:
    """32 nodes on the synthetic market (a new price every 6 h): each stay carries the mark of the market's
    prices then, and its interval is the last one where they moved since the last review, else doubled."""
    seen: list[tuple[int, int, float, dict[str, Any], dict[str, Any], str | None]] = []
    original = controller.SpotrelayRun.task_review

    def recorded(self: controller.SpotrelayRun, payload: dict[str, Any]) -> dict[str, Any]:
        # review.decide reads the prices only for a running gang whose nodes all train
        reads = self.running and all(n.state == "RUNNING" for n in self.gang.values())
        out = original(self, payload)
        prices = price_mark((p.key, round(p.price(self.now), 4)) for p in self.market.pools) if reads else None
        seen.append((id(self), self.attempt, self.now, payload, out, prices))
        return out

    monkeypatch.setattr(controller.SpotrelayRun, "task_review", recorded)
    simulate(CASES["synthetic-32"])
    stays = [s for s in seen if s[4]["outcome"] == "ready" and s[3]["attempt"] == s[1]]
    ceiling = WorkflowTimings().outcome_timeout_s
    held = 0
    for _, _, _, payload, out, prices in stays:
        assert out["review_mark"] == (payload["review_mark"] if prices is None else prices)
        moved = None not in (payload["review_mark"], prices) and payload["review_mark"] != prices
        held += moved and payload["review_s"] < 28800
        assert out["review_s"] == next_review_s(payload["review_s"], 1800, ceiling, moved=moved)
        assert out["review_s"] == (payload["review_s"] if moved else min(2 * payload["review_s"], 28800))
    assert held >= 3 and len(stays) > held  # (both answers are exercised, below the cap)
    for prev, cur in itertools.pairwise(seen):
        if prev[:2] == cur[:2] and prev[4]["outcome"] == "ready":
            assert cur[3]["review_mark"] == prev[4]["review_mark"]  # NextReviewMark carried it


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
