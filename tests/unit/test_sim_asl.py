"""The simulator walks functions/workflows/job_run.asl.json itself: change the file's paths and the
simulated job changes with them."""

from __future__ import annotations

import copy

import pytest

from spotrelay.sim.asl import AslError, Await, Finished, Sleep, TaskFailed, Walker, choice_matches, load_asl
from spotrelay.sim.records import Fault
from tests.unit.test_sim_calibration import demo_run


def test_simulated_job_takes_the_asl_states_in_order() -> None:
    run = demo_run((Fault("notice", rank=1, step=20, attempt=1),))
    visited = run.walker.visited
    first = ["Entry", "Init", "InitHops", "HopPlan", "HopPlanCheck", "Plan", "Placed", "Provision", "WaitReady",
             "IsReady", "WaitOutcome", "Outcome", "GatherLosses", "Recover", "Backoff", "HopPlan", "HopPlanCheck",
             "Plan", "Placed", "Provision", "WaitReady", "IsReady", "WaitOutcome", "Outcome",
             "Teardown", "Finalize", "Succeeded"]
    assert visited == first


def test_a_changed_choice_in_the_asl_changes_the_simulated_path() -> None:
    asl = copy.deepcopy(load_asl())
    outcome = asl["States"]["Outcome"]
    rule = next(r for r in outcome["Choices"] if r.get("StringEquals") == "succeeded")
    rule["Next"] = "Cancel"  # a (wrong) workflow that cancels finished jobs
    from spotrelay.sim import controller

    saved = dict(controller._ASL_CACHE)
    controller._ASL_CACHE["job_run"] = asl
    try:
        run = demo_run(())
    finally:
        controller._ASL_CACHE.clear()
        controller._ASL_CACHE.update(saved)
    assert run.walker.visited[-4:] == ["Outcome", "Cancel", "FinalizeCancelled", "Cancelled"]


def test_walker_catches_task_errors_by_name_and_waits_on_tokens() -> None:
    asl = load_asl()
    calls: list[str] = []

    def plan(_: dict) -> dict:
        calls.append("plan")
        if len(calls) == 1:
            raise TaskFailed("InsufficientCapacityError")  # not caught by Plan: goes to FailJob via States.ALL
        return {}

    handlers = {"fn_sfn_plan": plan, "fn_sfn_teardown": lambda p: {}, "fn_sfn_finalize": lambda p: {}}
    walker = Walker(asl, handlers, {"job_id": "j", "timings": {"ready_timeout_s": 5}})
    end = walker.advance()
    assert isinstance(end, Finished) and end.failed and "FailJob" in walker.visited
    assert walker.data["error"]["Error"] == "InsufficientCapacityError"


def test_wait_states_and_token_tasks_yield_to_the_event_loop() -> None:
    asl = load_asl()
    handlers = {"fn_sfn_plan": lambda p: {"candidates": []}, "fn_sfn_provision": lambda p: {"attempt": 1}}
    walker = Walker(asl, handlers, {"job_id": "j", "timings": {"ready_timeout_s": 7, "provision_retry_s": 3,
                                                              "loss_settle_s": 4}})
    waiting = walker.advance()
    assert waiting == Await("ready", 7.0)
    assert "Placed" in walker.visited and "PoolCooldown" not in walker.visited  # no wait_s: straight on
    handlers["fn_sfn_recover"] = lambda p: {"backoff_s": 11}
    assert walker.resume({"outcome": "node-lost"}) == Sleep(4.0)  # IsReady -> GatherLosses (the rest of a wave)
    assert walker.resume() == Sleep(11.0)  # -> Recover -> Backoff
    assert walker.visited[-3:] == ["GatherLosses", "Recover", "Backoff"]


def test_a_plan_that_must_wait_for_a_cooldown_sleeps_then_plans_again() -> None:
    asl = load_asl()
    plans = iter([{"candidates": [], "launch_ranks": [0], "wait_s": 240}, {"candidates": [], "launch_ranks": [0]}])
    handlers = {"fn_sfn_plan": lambda p: next(plans), "fn_sfn_provision": lambda p: {"attempt": 1}}
    walker = Walker(asl, handlers, {"job_id": "j", "timings": {"ready_timeout_s": 7}})
    assert walker.advance() == Sleep(240.0)
    assert walker.resume() == Await("ready", 7.0)
    assert walker.visited[:9] == ["Entry", "Init", "InitHops", "HopPlan", "HopPlanCheck", "Plan", "Placed",
                                  "PoolCooldown", "HopPlan"]


def test_choice_rules() -> None:
    data = {"a": {"s": "x", "n": 3, "b": True}}
    assert choice_matches({"Variable": "$.a.s", "StringEquals": "x"}, data)
    assert not choice_matches({"Variable": "$.a.missing", "StringEquals": "x"}, data)
    assert choice_matches({"And": [{"Variable": "$.a.n", "NumericLessThan": 4},
                                   {"Not": {"Variable": "$.a.b", "BooleanEquals": False}}]}, data)
    assert choice_matches({"Variable": "$.a.q", "IsPresent": False}, data)
    with pytest.raises(AslError):
        choice_matches({"Variable": "$.a.s", "StringMatches": "x*"}, data)
