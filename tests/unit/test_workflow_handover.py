"""The job-run workflow hands over to a new execution before Step Functions' 25,000-event history fills
(services/handover.py): the ASL counts its passes through Plan and Review with ``States.MathAdd`` and, at
``timings.max_hops``, the job goes on in its next execution from the same state with the same data. The
simulator walks the same states: a job handed over every few passes takes every decision it takes in one
execution."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from spotrelay.contracts.workflow import WorkflowTimings
from spotrelay.services.handover import next_input
from spotrelay.sim.asl import AslError, Walker, load_asl, resolve
from spotrelay.sim.build import MarketOptions, build_market
from spotrelay.sim.job import JobModel
from spotrelay.sim.runner import SimOptions, job_starts, make_run, run_seed

TRACE = str(Path(__file__).resolve().parents[2] / "spotrelay" / "local" / "data" / "bamboo-g4dn-trace.csv")


def test_math_add_is_the_one_intrinsic_the_walker_takes() -> None:
    assert resolve({"count.$": "States.MathAdd($.hops.count, 1)"}, {"hops": {"count": 4}}, {}) == {"count": 5}
    with pytest.raises(AslError, match="not implemented"):
        resolve({"x.$": "States.Format('{}', $.a)"}, {"a": 1}, {})
    with pytest.raises(AslError, match="not an integer"):
        resolve({"x.$": "States.MathAdd($.a, 1)"}, {"a": "1"}, {})


def _next_states(state: dict[str, Any]) -> set[str]:
    found = {state.get("Next"), state.get("Default")}
    found |= {rule.get("Next") for rule in (*state.get("Choices", ()), *state.get("Catch", ()))}
    return {name for name in found if name}


def test_every_loop_of_the_job_run_passes_a_hop() -> None:
    """The hand-over bounds the history only if no loop can go round uncounted: with the Hop states
    taken out, the graph has no cycle (a Prewarm once looped back to the outcome wait uncounted)."""
    states = load_asl()["States"]
    hops = {name for name, state in states.items() if "States.MathAdd($.hops.count" in str(state.get("Parameters"))}
    assert hops == {"HopPlan", "HopReview", "HopPrewarm"}
    edges = {name: _next_states(state) - hops for name, state in states.items() if name not in hops}
    done: set[str] = set()

    def cycle_from(name: str, path: tuple[str, ...]) -> tuple[str, ...] | None:
        if name in path:
            return (*path[path.index(name):], name)
        if name in done:
            return None
        for following in sorted(edges[name]):
            found = cycle_from(following, (*path, name))
            if found:
                return found
        done.add(name)
        return None

    for name in sorted(edges):
        assert cycle_from(name, ()) is None, f"a loop without a hop: {' -> '.join(cycle_from(name, ()) or ())}"

    longest: dict[str, int] = {}  # states on the longest way from a state to the next hop or the end

    def states_to_hop(name: str) -> int:
        if name not in longest:
            longest[name] = 1 + max((states_to_hop(n) for n in edges[name]), default=0)
        return longest[name]

    # timings.max_hops (250) assumes a pass writes at most ~75 events (~5 a state): a longer pass needs it lower
    assert max(states_to_hop(name) for name in edges) <= 15


def test_the_next_input_resumes_at_the_same_state_with_its_passes_counted_again() -> None:
    data = {"job_id": "j", "timings": {"max_hops": 3}, "hops": {"count": 3}, "launch": {"attempt": 2},
            "error": {"Error": "States.Timeout"}, "handover": {"old": 1}}
    first, generation = next_input(data, "review")
    assert generation == 1 and first["resume_at"] == "review" and first["hops"] == {"count": 0, "generation": 1}
    assert first["launch"] == {"attempt": 2} and "handover" not in first and "error" not in first
    second, generation = next_input({**first, "hops": {"count": 3, "generation": 1}}, "plan")
    assert generation == 2 and second["resume_at"] == "plan"


def test_the_asl_hands_over_at_max_hops_and_a_new_execution_resumes_where_it_stopped() -> None:
    asl = load_asl()
    plans = iter([{"candidates": [], "launch_ranks": [0], "wait_s": 60}] * 3)
    calls: list[dict[str, Any]] = []
    handlers = {"fn_sfn_plan": lambda p: next(plans), "fn_sfn_handover": lambda p: calls.append(p) or {}}
    walker = Walker(asl, handlers, {"job_id": "j", "timings": {"max_hops": 2}})
    walker.advance()  # pass 1: Plan, then its cooldown
    end = walker.resume()  # pass 2: hand over
    assert walker.visited[-3:] == ["HopPlanCheck", "HandOverPlan", "HandedOver"] and not end.failed  # type: ignore[union-attr]
    assert calls[0]["resume_at"] == "plan" and calls[0]["data"]["hops"]["count"] == 2
    again = Walker(asl, handlers, next_input(calls[0]["data"], "plan")[0])
    again.advance()
    assert again.visited[:2] == ["Entry", "Plan"]
    unbounded = Walker(asl, {"fn_sfn_plan": lambda p: {"candidates": [], "launch_ranks": [0], "wait_s": 60}},
                       {"job_id": "j", "timings": {}})  # (an input without max_hops never hands over)
    for _ in range(5):
        unbounded.resume()
    assert "HandOverPlan" not in unbounded.visited


def test_a_prewarm_is_a_pass_and_its_hand_over_resumes_at_the_outcome_wait() -> None:
    asl = load_asl()
    calls: list[dict[str, Any]] = []
    handlers = {"fn_sfn_provision": lambda p: {"launched": []}, "fn_sfn_handover": lambda p: calls.append(p) or {}}
    data = {"job_id": "j", "timings": {"max_hops": 2, "heartbeat_s": 600}, "hops": {"count": 1},
            "launch": {"attempt": 1, "review_s": 1800}}
    walker = Walker(asl, handlers, {**data, "resume_at": "wait"})
    walker.advance()  # the handed-over execution's first state is the outcome wait
    assert walker.visited == ["Entry", "WaitOutcome"]
    walker.resume({"outcome": "rebalance"})
    assert walker.visited[-6:] == ["Outcome", "Prewarm", "HopPrewarm", "HopPrewarmCheck", "HandOverWait",
                                   "HandedOver"]
    assert calls[0]["resume_at"] == "wait" and calls[0]["data"]["hops"]["count"] == 2
    below = Walker(asl, handlers, {**data, "resume_at": "wait", "timings": {"max_hops": 3, "heartbeat_s": 600}})
    below.advance()
    below.resume({"outcome": "rebalance"})
    assert below.visited[-2:] == ["HopPrewarmCheck", "WaitOutcome"] and len(calls) == 1


def test_a_simulated_job_handed_over_every_few_passes_takes_the_same_decisions() -> None:
    def run(**switches: Any) -> tuple[dict[str, float], int]:
        opts = SimOptions(market=MarketOptions(traces=[TRACE]), job=JobModel(nodes=16, job_hours=24.0),
                          policies=("spotrelay",), spotrelay_switches=switches)
        one = make_run("spotrelay", opts, build_market(opts.market, 0), 0, job_starts(0, 1)[0])
        one.start()  # type: ignore[attr-defined]
        one.loop()
        return run_seed(opts, 0)[0].values, one.executions  # type: ignore[attr-defined]

    default, once = run()  # (250 passes: this stormy day hands over about once already)
    assert WorkflowTimings().max_hops == 250 and once <= 3
    handed, executions = run(max_hops=3)
    assert executions > 20 * once  # reviews and recoveries: a new execution every 3 passes
    assert handed == default


def test_a_simulated_job_handed_over_at_its_prewarms_takes_the_same_decisions(monkeypatch: pytest.MonkeyPatch) -> None:
    """The synthetic market sends rebalance recommendations ahead of some notices (the trace's capacity
    drops come with none): with prewarm on and a hand-over every other pass, some executions end at a
    Prewarm and the next one starts at the outcome wait."""
    from spotrelay.sim.controller import SpotrelayRun

    resumed: list[str] = []
    hand_over = SpotrelayRun.task_handover  # (a spy: the shipped task still runs)
    monkeypatch.setattr(SpotrelayRun, "task_handover",
                        lambda run, p: resumed.append(p["resume_at"]) or hand_over(run, p))

    def run(**switches: Any) -> dict[str, float]:
        opts = SimOptions(market=MarketOptions(trace_format="synthetic", synthetic_days=10),
                          job=JobModel(nodes=32, job_hours=120.0), policies=("spotrelay",),
                          spotrelay_switches={"prewarm_on_rebalance": True, **switches})
        return run_seed(opts, 0)[0].values

    default = run()
    assert resumed == []
    assert run(max_hops=2) == default
    assert resumed.count("wait") >= 5 and {"plan", "review"} <= set(resumed)
