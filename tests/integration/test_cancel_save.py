"""``spotrelay cancel --save``: the ranks save first (CHECKPOINT_NOW with a deadline), and the workflow's
waits are woken once every rank exited, or by the reconcile sweep once the deadline passed (moto job
store, the real handlers)."""

from __future__ import annotations

import copy
import json
import time

import pytest

from functions import on_agent_event, reconcile
from spotrelay.contracts.events import DirectiveKind, parse_directive
from spotrelay.domain.status import JobStatus
from spotrelay.services.cancel import request_cancel
from tests.integration.controller_doubles import Env, agent_event, ctx, env, load_event, running_job

__all__ = ["env"]


def _sweep(minute: int) -> dict[str, object]:
    event = copy.deepcopy(load_event("scheduled_event.json"))
    event["time"] = f"2026-11-30T04:{minute:02d}:00Z"
    return reconcile.handler(event, ctx())


def test_the_ranks_save_then_the_workflow_tears_down(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    job, gang = running_job(env.store, env.compute, tokens={"outcome": "tok-out"})
    now = time.time()
    asked = request_cancel(job.job_id, store=env.store, workflow=env.workflow, now=now, reason="new lr", save_s=600)
    assert asked.status is JobStatus.CANCELLING and asked.stop_save_by == pytest.approx(now + 600)
    assert "cancelled: new lr" in asked.reasons and asked.stop_error == "JobCancelledError"
    for node in gang:
        directive = parse_directive(env.store.get_node(job.job_id, node.node_id).directive)
        # no deadline: save at the next step (with one the ranks would train on until just before it)
        assert directive.kind is DirectiveKind.CHECKPOINT_NOW and directive.deadline is None
    assert env.workflow.completed == []  # the waits stay until the ranks saved
    from rich.console import Console
    from typer.testing import CliRunner

    from spotrelay.cli import main as cli_main
    from spotrelay.cli.main import app

    monkeypatch.setattr(cli_main, "out", Console(width=200))  # (its console's width was set at import)
    shown = " ".join(CliRunner().invoke(app, ["status", job.job_id]).output.split())
    assert "stopping: the ranks save, then the job ends cancelled (by " in shown and "): new lr" in shown
    described = json.loads(CliRunner().invoke(app, ["describe", job.job_id, "--json"]).stdout)
    assert described["stopping"].startswith("stopping: the ranks save")
    again = request_cancel(job.job_id, store=env.store, workflow=env.workflow, now=now + 1, save_s=600)
    assert again.stop_save_by == asked.stop_save_by and env.workflow.completed == []  # asked again: no change

    on_agent_event.handler(agent_event("TrainingExited", gang[0], exit_code=75, reason="saved"), ctx())
    assert env.workflow.completed == []  # one rank still saving
    on_agent_event.handler(agent_event("TrainingExited", gang[1], exit_code=75, reason="saved"), ctx())
    assert [(kind, token, out["error"]) for kind, token, out in env.workflow.completed] == [
        ("failure", "tok-out", "JobCancelledError")]


def test_a_save_past_its_deadline_is_not_waited_for(env: Env) -> None:
    job, _gang = running_job(env.store, env.compute, tokens={"outcome": "tok-out"})
    assert job.execution_arn is not None
    env.workflow.executions[job.execution_arn] = "RUNNING"
    request_cancel(job.job_id, store=env.store, workflow=env.workflow, now=time.time() - 700, save_s=600)
    assert env.workflow.completed == []
    report = _sweep(1)  # one rank never exited: the sweep wakes the waits past the deadline
    assert report["stopped"] == [job.job_id]
    assert [c[2]["error"] for c in env.workflow.completed] == ["JobCancelledError"]


def test_a_second_cancel_without_save_does_not_wait_for_it(env: Env) -> None:
    job, _gang = running_job(env.store, env.compute, tokens={"outcome": "tok-out"})
    request_cancel(job.job_id, store=env.store, workflow=env.workflow, now=time.time(), save_s=600)
    assert env.workflow.completed == []
    request_cancel(job.job_id, store=env.store, workflow=env.workflow, now=time.time())
    assert [c[2]["error"] for c in env.workflow.completed] == ["JobCancelledError"]


def test_without_save_or_training_the_cancel_is_immediate(env: Env) -> None:
    job, _ = running_job(env.store, env.compute, tokens={"outcome": "tok-out"})
    done = request_cancel(job.job_id, store=env.store, workflow=env.workflow, now=time.time())
    assert done.stop_save_by is None and len(env.workflow.completed) == 1
    placing, _ = running_job(env.store, env.compute, job_id="job-placing", status=JobStatus.PLACING,
                             tokens={"outcome": "tok-2"})
    asked = request_cancel(placing.job_id, store=env.store, workflow=env.workflow, now=time.time(), save_s=600)
    assert asked.stop_save_by is None and len(env.workflow.completed) == 2  # nothing trains: no save
    with pytest.raises(ValueError, match=r"the save may take above 0 and at most 3600 s \(got 0\)"):
        request_cancel(job.job_id, store=env.store, workflow=env.workflow, now=time.time(), save_s=0)


def test_the_cli_refuses_a_save_time_it_cannot_wait_for() -> None:
    from typer.testing import CliRunner

    from spotrelay.cli.main import app

    for bad in ("0", "-1", "61", "nan"):
        result = CliRunner().invoke(app, ["cancel", "job-x", "--save", "--save-minutes", bad])
        assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
        assert f"--save-minutes: above 0 and at most 60 (got {bad})" in result.output  # (0 read as allowed)
    # without --save it would be ignored (the teardown would not wait): refused, before any AWS call
    result = CliRunner().invoke(app, ["cancel", "job-x", "--save-minutes", "30", "--endpoint-url", "http://127.0.0.1:1"])
    assert result.exit_code == 2 and "--save-minutes applies with --save only" in result.output, result.output


def test_a_cancel_during_the_budgets_save_ends_as_cancelled(env: Env) -> None:
    job, gang = running_job(env.store, env.compute, tokens={"outcome": "tok-out"})
    assert job.execution_arn is not None
    env.workflow.executions[job.execution_arn] = "RUNNING"  # (not stuck)
    env.store.update_job(job.job_id, lambda j: j.model_copy(update={
        "spec": {**j.spec, "budget": {"max_total_cost": 500}},
        "attempts": [j.attempts[0].model_copy(update={"started_at": time.time() - 36000})]}))
    assert _sweep(2)["over_budget"] == [job.job_id]
    assert env.store.get_job(job.job_id).stop_error == "BudgetExceededError"
    asked = request_cancel(job.job_id, store=env.store, workflow=env.workflow, now=time.time(), save_s=600)
    assert asked.status is JobStatus.CANCELLING and asked.stop_error == "JobCancelledError"
    assert env.workflow.completed == []  # still waiting for the save already under way
    for node in gang:
        on_agent_event.handler(agent_event("TrainingExited", node, exit_code=75, reason="saved"), ctx())
    assert [c[2]["error"] for c in env.workflow.completed] == ["JobCancelledError"]
