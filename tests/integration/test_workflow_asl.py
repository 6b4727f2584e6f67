"""Static checks of functions/workflows/job_run.asl.json: the conventions CDK and the twin rely on."""

from __future__ import annotations

import importlib
import json
import re
from typing import Any

import pytest

from spotrelay import errors
from spotrelay.contracts.workflow import WorkflowTimings
from spotrelay.local import workflow_setup

ASL: dict[str, Any] = json.loads(workflow_setup.asl_text())
STATES: dict[str, dict[str, Any]] = ASL["States"]


def _targets(state: dict[str, Any]) -> list[str]:
    out = [state["Next"]] if "Next" in state else []
    out += [c["Next"] for c in state.get("Catch", [])]
    out += [c["Next"] for c in state.get("Choices", [])]
    out += [state["Default"]] if "Default" in state else []
    return out


def test_placeholders_name_handler_modules() -> None:
    placeholders = set(re.findall(r"\$\{([^}]+)\}", workflow_setup.asl_text()))
    assert placeholders and all(p.startswith("fn_") for p in placeholders)
    for module in workflow_setup.lambda_modules():
        assert callable(importlib.import_module(f"functions.{module}").handler)
    with pytest.raises(ValueError, match="unresolved"):
        workflow_setup.render(workflow_setup.asl_text(), {})


def test_graph_is_closed_and_every_state_reachable() -> None:
    seen, todo = set(), [ASL["StartAt"]]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        assert name in STATES, f"missing state {name}"
        seen.add(name)
        todo += _targets(STATES[name])
    assert seen == set(STATES)


def test_error_names_are_our_exception_classes() -> None:
    for name, state in STATES.items():
        for rule in state.get("Retry", []) + state.get("Catch", []):
            for error in rule["ErrorEquals"]:
                if error.startswith(("States.", "Lambda.")):
                    continue
                cls = getattr(errors, error, None)
                assert isinstance(cls, type) and issubclass(cls, errors.SpotrelayError), f"{name}: {error}"


HAND_OVER = {"HandOverPlan": "Plan", "HandOverReview": "Review", "HandOverWait": "WaitOutcome"}


def test_every_task_has_a_catch_all_that_tears_down() -> None:
    teardown = {"FailJob", "FinalizeFailed", "FinalizeCancelled", "JobFailed"}
    for name, state in STATES.items():
        if state["Type"] != "Task":
            continue
        catch_all = [c for c in state.get("Catch", []) if "States.ALL" in c["ErrorEquals"]]
        assert catch_all, f"{name} has no catch-all"
        if name in HAND_OVER:  # a failed hand-over goes on in this execution (services/handover.py)
            assert catch_all[0]["Next"] == HAND_OVER[name], name
            continue
        assert catch_all[0]["Next"] in teardown
        assert "Retry" not in state or not state["Resource"].endswith("waitForTaskToken"), name  # moto gap


def test_waits_and_timeouts_come_from_the_input() -> None:
    fields = set(WorkflowTimings.model_fields)
    for state in STATES.values():
        for key in ("SecondsPath", "TimeoutSecondsPath", "HeartbeatSecondsPath"):
            if key in state:
                path = state[key]
                # $.launch.review_s: provision's bound of the outcome wait (timings.outcome_timeout_s at most);
                # $.plan.wait_s: the first pool cooldown's end, when every allowed pool cools down
                assert path.startswith(("$.timings.", "$.recovery.")) or path in ("$.launch.review_s",
                                                                                  "$.plan.wait_s"), path
                if path.startswith("$.timings."):
                    assert path.removeprefix("$.timings.") in fields
        assert "TimeoutSeconds" not in state and "Seconds" not in state and "HeartbeatSeconds" not in state
    wait = [s for s in STATES.values() if s.get("Resource", "").endswith("waitForTaskToken")]
    assert len(wait) == 2 and all(s["Parameters"]["Payload"]["task_token.$"] == "$$.Task.Token" for s in wait)
