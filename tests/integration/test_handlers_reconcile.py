"""reconcile with the real scheduled-event format against moto: stale heartbeats, orphans, stuck
executions; a redelivered run changes nothing twice."""

from __future__ import annotations

import copy
import json
import time

import pytest

from functions import on_agent_event, reconcile
from spotrelay.adapters.aws import client
from spotrelay.contracts.events import DirectiveKind, parse_directive
from spotrelay.domain.models import CheckpointRef, NodeState
from spotrelay.domain.status import JobStatus
from spotrelay.ports.compute import LaunchRequest
from tests.integration.controller_doubles import Env, agent_event, ctx, env, load_event, pool, running_job

__all__ = ["env"]


def _run(minute: int) -> dict[str, object]:
    event = copy.deepcopy(load_event("scheduled_event.json"))
    event["time"] = f"2026-11-30T03:{minute:02d}:00Z"
    return reconcile.handler(event, ctx())


def test_stale_heartbeat_is_a_node_loss(env: Env) -> None:
    job, _gang = running_job(env.store, env.compute, tokens={"outcome": "tok-out"})
    env.workflow.executions[job.execution_arn] = "RUNNING"  # its workflow waits for the outcome (not stuck)
    fresh, silent = time.time(), time.time() - 3600
    env.store.update_node(job.job_id, "a1-r0", lambda n: n.model_copy(update={"last_heartbeat": fresh}))
    env.store.update_node(job.job_id, "a1-r1", lambda n: n.model_copy(update={"last_heartbeat": silent}))
    report = _run(1)
    assert report["lost"] == [f"{job.job_id}/a1-r1"]
    assert env.store.get_node(job.job_id, "a1-r1").state is NodeState.LOST
    assert env.store.get_node(job.job_id, "a1-r0").state is NodeState.READY
    assert [c[2]["outcome"] for c in env.workflow.completed] == ["node-lost"]
    assert _run(1) == report  # the same run delivered twice
    assert _run(2)["lost"] == []  # the next minute: already lost, nothing new
    assert len(env.workflow.completed) == 1


def test_a_silent_node_ec2_took_is_lost_with_its_reclaim_time_a_hung_one_without(env: Env) -> None:
    """A stale heartbeat whose instance EC2 interrupted (its events never came: Compute.spot_reclaimed)
    gets ec2_reclaim_at, so the ledger leaves its unbilled first hour out; a hung instance does not."""
    job, gang = running_job(env.store, env.compute, tokens={"outcome": "tok-out"})
    env.workflow.executions[job.execution_arn] = "RUNNING"
    silent = time.time() - 3600
    for node in gang:
        env.store.update_node(job.job_id, node.node_id, lambda n: n.model_copy(update={"last_heartbeat": silent}))
    env.compute.reclaim(gang[1].instance_id)  # EC2 took rank 1; rank 0 hangs, still running
    report = _run(1)
    lost = report["lost"]
    assert isinstance(lost, list) and sorted(lost) == [f"{job.job_id}/a1-r0", f"{job.job_id}/a1-r1"]
    taken, hung = env.store.get_node(job.job_id, "a1-r1"), env.store.get_node(job.job_id, "a1-r0")
    assert taken.state is hung.state is NodeState.LOST
    assert taken.ec2_reclaim_at is not None and hung.ec2_reclaim_at is None


def test_orphans_and_instances_of_finished_jobs_are_terminated(env: Env) -> None:
    job, gang = running_job(env.store, env.compute)
    env.workflow.start(job.job_id, {})  # its execution runs
    done, done_gang = running_job(env.store, env.compute, job_id="job-finished")
    env.store.update_job(done.job_id, lambda j: j.model_copy(update={"status": JobStatus.SUCCEEDED}))
    stray = env.compute.launch(LaunchRequest(job_id="job-unknown", attempt=1, pool=pool(), count=1, ranks=[0]))
    # a leftover of attempt 1 after the job moved on to attempt 2
    env.store.update_job(job.job_id, lambda j: j.model_copy(update={"attempt": 2}))
    env.compute.launch(LaunchRequest(job_id=job.job_id, attempt=2, pool=pool(), count=1, ranks=[0]))
    report = _run(3)
    expected = sorted([stray[0].instance_id, *(n.instance_id for n in done_gang), *(n.instance_id for n in gang)])
    assert report["orphans"] == expected and report["stuck"] == []
    assert len(env.compute.running(job.job_id)) == 1  # the current attempt's instance stays
    assert env.compute.running(done.job_id) == [] and env.compute.running("job-unknown") == []


def test_stuck_execution_fails_the_job_and_releases_it(env: Env) -> None:
    job, _gang = running_job(env.store, env.compute)
    assert job.execution_arn is not None
    env.workflow.executions[job.execution_arn] = "FAILED"
    report = _run(4)
    assert report["stuck"] == [job.job_id]
    final = env.store.get_job(job.job_id)
    assert final.status is JobStatus.FAILED and "workflow execution FAILED" in final.reasons[-1]
    assert env.compute.running(job.job_id) == []


def test_healthy_jobs_are_left_alone(env: Env) -> None:
    job, gang = running_job(env.store, env.compute)
    assert job.execution_arn is not None
    env.workflow.executions[job.execution_arn] = "RUNNING"
    for node in gang:
        env.store.update_node(job.job_id, node.node_id, lambda n: n.model_copy(update={"last_heartbeat": time.time()}))
    before = env.store.get_job(job.job_id)
    report = _run(5)
    assert report == {"jobs": 1, "lost": [], "orphans": [], "stuck": [], "over_budget": [], "budget_warned": [],
                      "stopped": [], "profiles": [], "standbys": [], "healed": [], "failed": [], "pruned": 0}
    assert env.store.get_job(job.job_id) == before and len(env.compute.running(job.job_id)) == 2


def test_one_jobs_failure_does_not_leave_the_others_unswept(env: Env) -> None:
    """A poison job (here: its node records cannot be read, every time) is logged, reported and
    counted; the sweep still finds the other job's silent node and its stuck execution, and the next
    sweep tries the poison job again."""
    from spotrelay.services.controller import Controller
    from spotrelay.services.reconcile import reconcile as sweep

    poison, _ = running_job(env.store, env.compute, job_id="job-poison", tokens={"outcome": "tok-p"})
    job, _ = running_job(env.store, env.compute, tokens={"outcome": "tok-out"})
    assert job.execution_arn is not None and poison.execution_arn is not None
    env.workflow.executions[job.execution_arn] = "FAILED"  # the other job's execution died: stuck
    env.workflow.executions[poison.execution_arn] = "RUNNING"
    silent = time.time() - 3600
    env.store.update_node(job.job_id, "a1-r1", lambda n: n.model_copy(update={"last_heartbeat": silent}))

    class Store:  # the job store, whose reads of the poison job's nodes always fail
        def __getattr__(self, name: str) -> object:
            return getattr(env.store, name)

        def nodes_of(self, job_id: str) -> object:
            if job_id == poison.job_id:
                raise RuntimeError("ProvisionedThroughputExceededException, again")
            return env.store.nodes_of(job_id)

    published: list[tuple[str, float]] = []

    class Sink:
        def put(self, name: str, value: float, unit: str = "Count") -> None:
            published.append((name, value))

    ctl = Controller(store=Store(), workflow=env.workflow, compute=env.compute, metrics=Sink())  # type: ignore[arg-type]
    report = sweep(ctl, time.time())
    assert "job-poison: stale: RuntimeError" in report["failed"]
    assert report["lost"] == [f"{job.job_id}/a1-r1"] and report["stuck"] == [job.job_id]
    assert env.store.get_node(job.job_id, "a1-r1").state is NodeState.LOST
    assert ("ReconcileJobErrors", len(report["failed"])) in published


def test_job_stuck_in_a_passing_status_is_stopped_and_failed(env: Env) -> None:
    job, _gang = running_job(env.store, env.compute, status=JobStatus.PROVISIONING)
    assert job.execution_arn is not None
    env.workflow.executions[job.execution_arn] = "RUNNING"
    env.store.update_job(job.job_id, lambda j: j.model_copy(update={"updated_at": time.time() - 7200}))
    assert _run(6)["stuck"] == [job.job_id]
    assert env.workflow.executions[job.execution_arn] == "ABORTED"
    final = env.store.get_job(job.job_id)
    assert final.status is JobStatus.FAILED and "stuck in PROVISIONING" in final.reasons[-1]
    assert env.compute.running(job.job_id) == []


def test_over_budget_saves_then_fails_the_outcome_wait_once(env: Env) -> None:
    job, gang = running_job(env.store, env.compute, tokens={"outcome": "tok-out"})
    assert job.execution_arn is not None
    env.workflow.executions[job.execution_arn] = "RUNNING"
    # 2 nodes x $30/h for 10 hours = $600 on a $500 budget
    env.store.update_job(job.job_id, lambda j: j.model_copy(update={
        "spec": {**j.spec, "budget": {"max_total_cost": 500}},
        "attempts": [j.attempts[0].model_copy(update={"started_at": time.time() - 36000})]}))
    assert _run(7)["over_budget"] == [job.job_id]
    # the ranks save first (services/stop.py): CHECKPOINT_NOW without a deadline, the wait untouched
    saving = env.store.get_job(job.job_id)
    assert saving.stop_save_by is not None and saving.stop_error == "BudgetExceededError"
    for node in gang:
        directive = parse_directive(env.store.get_node(job.job_id, node.node_id).directive)
        assert directive.kind is DirectiveKind.CHECKPOINT_NOW and directive.deadline is None
    assert _run(8)["over_budget"] == [] and env.workflow.completed == []
    for node in gang:  # saved and stopped: a rank's exit 75 is the stop's, not an end to recover from
        on_agent_event.handler(agent_event("TrainingExited", node, exit_code=75, reason="saved"), ctx())
    assert len(env.workflow.completed) == 1
    kind, token, detail = env.workflow.completed[0]
    assert (kind, token, detail["error"]) == ("failure", "tok-out", "BudgetExceededError")
    assert "of the $500.00 budget" in detail["cause"]
    assert env.store.get_job(job.job_id).reasons[-1].startswith("budget: spent $")


def _open_for(env: Env, job_id: str, seconds: float, saved: CheckpointRef | None = None) -> None:
    """A $500 budget and the open attempt (2 nodes x $30/h: $1 a minute) started ``seconds`` ago."""
    env.store.update_job(job_id, lambda j: j.model_copy(update={
        "spec": {**j.spec, "budget": {"max_total_cost": 500}}, "last_checkpoint": saved or j.last_checkpoint,
        "attempts": [j.attempts[0].model_copy(update={"started_at": time.time() - seconds})]}))


def test_the_budget_stops_a_job_a_sweep_and_its_measured_save_ahead(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """A budget is a cap: the sweep stops the job while the next sweep and the ranks' save (the newest
    measured one, 1.5x) still fit in it, so what the stop spends does not pass it."""
    job, _gang = running_job(env.store, env.compute, tokens={"outcome": "tok-out"})
    assert job.execution_arn is not None
    env.workflow.executions[job.execution_arn] = "RUNNING"

    def spent_minutes(minutes: float) -> None:  # $1 a minute, a 60 s save measured
        _open_for(env, job.job_id, minutes * 60, CheckpointRef(step=10, uri="s3://b/ckpt/10",
                                                              committed_at=time.time(), duration_s=60.0))

    spent_minutes(496.5)  # a minute's sweep and a 90 s save ahead: $499, within it
    assert _run(14)["over_budget"] == []
    spent_minutes(498)  # $500.50 by the save's end: stop now
    assert _run(15)["over_budget"] == [job.job_id]
    reason = env.store.get_job(job.job_id).reasons[-1]
    assert reason.startswith("budget: spent $498.0") and "of the $500.00 budget; the ranks' save and the next " \
        "sweep (2.5 min at the running attempt's rate) would spend the rest" in reason

    monkeypatch.setenv("SPOTRELAY_RECONCILE_S", "600")  # a ten-minute schedule: ten minutes further ahead
    other, _ = running_job(env.store, env.compute, job_id="job-slow-sweep", tokens={"outcome": "tok-2"})
    assert other.execution_arn is not None
    env.workflow.executions[other.execution_arn] = "RUNNING"
    _open_for(env, other.job_id, 489 * 60)
    assert _run(16)["over_budget"] == [other.job_id]  # $489 + 10 min + 2 min (no save measured yet)


def test_over_budget_with_no_rank_training_fails_at_once(env: Env) -> None:
    job, gang = running_job(env.store, env.compute, tokens={"outcome": "tok-out"})
    for node in gang:
        env.store.update_node(job.job_id, node.node_id, lambda n: n.model_copy(update={"state": NodeState.LOST}))
    env.store.update_job(job.job_id, lambda j: j.model_copy(update={
        "spec": {**j.spec, "budget": {"max_total_cost": 500}},
        "attempts": [j.attempts[0].model_copy(update={"started_at": time.time() - 36000})]}))
    assert _run(13)["over_budget"] == [job.job_id]
    assert [c[2]["error"] for c in env.workflow.completed] == ["BudgetExceededError"]
    assert env.store.get_job(job.job_id).stop_save_by is None


def test_a_nearly_spent_budget_is_announced_once(env: Env, aws: dict[str, str]) -> None:
    sqs = client("sqs")
    url = sqs.create_queue(QueueName="budget-probe")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    client("sns").subscribe(TopicArn=aws["topic_arn"], Protocol="sqs", Endpoint=arn)
    job, _gang = running_job(env.store, env.compute, tokens={"outcome": "tok-out"})
    assert job.execution_arn is not None
    env.workflow.executions[job.execution_arn] = "RUNNING"

    def spent_hours(hours: float) -> None:  # $60 an hour
        _open_for(env, job.job_id, hours * 3600)

    spent_hours(6.0)  # $360: 72%, under the default warn_at of 0.8
    assert _run(9)["budget_warned"] == []
    spent_hours(7.0)  # $420: 84%
    assert _run(10)["budget_warned"] == [job.job_id]
    assert _run(10)["budget_warned"] == [job.job_id]  # a redelivered event answers as its first run did
    assert _run(11)["budget_warned"] == []  # the next minute: told already
    warned = env.store.get_job(job.job_id)
    assert warned.budget_warned_at is not None and warned.status is JobStatus.RUNNING
    assert env.workflow.completed == []  # a warning stops nothing
    bodies = [json.loads(m["Body"]) for m in sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10,
                                                                   WaitTimeSeconds=1).get("Messages", [])]
    assert len(bodies) == 1 and bodies[0]["MessageAttributes"]["kind"]["Value"] == "budget"
    assert bodies[0]["Subject"].startswith("spotrelay: job ")
    assert "of the $500.00 budget (8" in bodies[0]["Subject"]
    message = json.loads(bodies[0]["Message"])
    assert "the job stops at $500.00, at 20" in message["context"]["reason"]  # (when, at this rate)
    assert message["context"]["reason"].endswith("UTC at the running attempt's rate")
    assert message["context"]["cost_so_far"] == pytest.approx(420.0, abs=1.0)  # the running attempt's clock


def test_an_unreadable_budget_in_one_record_does_not_stop_the_sweep(env: Env) -> None:
    odd, _ = running_job(env.store, env.compute, job_id="job-odd")
    good, _ = running_job(env.store, env.compute, job_id="job-good")
    for job_id, budget in (("job-odd", {"max_total_cost": "lots"}), ("job-good", {"max_total_cost": 100})):
        env.store.update_job(job_id, lambda j, b=budget: j.model_copy(update={
            "spec": {**j.spec, "budget": b},
            "attempts": [j.attempts[0].model_copy(update={"started_at": time.time() - 5400})]}))  # $90 spent
    report = _run(12)
    assert report["budget_warned"] == ["job-good"] and odd.job_id != good.job_id


def test_agent_roles_a_failed_teardown_left_are_deleted(env: Env) -> None:
    live, gang = running_job(env.store, env.compute)
    assert live.execution_arn is not None
    env.workflow.executions[live.execution_arn] = "RUNNING"  # healthy: nothing else tears it down
    for node in gang:
        env.store.update_node(live.job_id, node.node_id, lambda n: n.model_copy(update={"last_heartbeat": time.time()}))
    done, _ = running_job(env.store, env.compute, job_id="job-finished")
    env.store.update_job(done.job_id, lambda j: j.model_copy(update={"status": JobStatus.SUCCEEDED}))
    env.compute.profiles.add("job-unknown")  # a role whose job record is gone
    assert env.compute.job_profiles() == sorted([live.job_id, "job-finished", "job-unknown"])
    report = _run(7)
    assert report["profiles"] == ["job-finished", "job-unknown"]
    assert env.compute.job_profiles() == [live.job_id]  # the live job keeps its role
    assert _run(8)["profiles"] == []


def test_submissions_left_half_way_are_finished(env: Env) -> None:
    """A handler that died after recording the job (SUBMITTED) or after validating it (VALIDATED, no
    execution) leaves it to the sweep once it is a few minutes old; a fresh one is left alone."""
    from spotrelay.adapters.aws import client
    from spotrelay.domain.models import Job
    from spotrelay.settings import settings
    from tests.conftest import ROOT

    body = (ROOT / "examples" / "tiny.yaml").read_bytes()
    old, now = time.time() - 600, time.time()
    jobs = {"sub-old": (JobStatus.SUBMITTED, old, body), "sub-new": (JobStatus.SUBMITTED, now, body),
            "bad-old": (JobStatus.SUBMITTED, old, b"version: 1\nname: [\n"),
            "val-old": (JobStatus.VALIDATED, old, body)}
    for job_id, (status, at, text) in jobs.items():
        key = f"submissions/{job_id}.yaml"
        client("s3").put_object(Bucket=settings().bucket, Key=key, Body=text)
        env.store.create_job(Job(job_id=job_id, name=job_id, status=status, submission_key=key,
                                 created_at=at, updated_at=at))
    report = _run(7)
    assert sorted(report["healed"]) == ["bad-old:rejected", "sub-old:started", "val-old:started"]
    assert env.store.get_job("sub-old").status is JobStatus.VALIDATED
    assert env.store.get_job("sub-old").execution_arn in env.workflow.executions
    assert env.store.get_job("bad-old").status is JobStatus.REJECTED
    assert env.store.get_job("sub-new").status is JobStatus.SUBMITTED
    client("s3").head_object(Bucket=settings().bucket, Key="submissions/bad-old.yaml.rejected.json")
    assert _run(8)["healed"] == []
