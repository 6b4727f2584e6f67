"""MLflow lineage (real MLflow, sqlite store): one parent run per job, one nested child per attempt,
per-step metrics on both, checkpoint times, the final manifest as an artifact, the registered model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent.config import AgentConfig
from agent.tracking import JobTracking
from spotrelay.contracts.agent import JobView
from spotrelay.domain.models import Attempt, Job, Pool
from spotrelay.domain.status import JobStatus
from spotrelay.spec.models import JobSpec
from tests.unit.agent_harness import HANG_S, wait_for

POOL = Pool(region="us-east-1", az="us-east-1b", instance_type="p4d.24xlarge", market="spot")


class JobOnly:
    """The job record as the agent's port shows it; ``record`` is what the controller does with the
    agent's TrackingStarted."""

    def __init__(self, job: Job) -> None:
        self.job = job

    @property
    def view(self) -> JobView:
        return JobView.model_validate(self.job.model_dump(mode="json"))

    def record(self, run_id: str) -> None:
        self.job = self.job.model_copy(update={"mlflow_run_id": run_id})


def _spec(uri: str) -> JobSpec:
    return JobSpec.model_validate(
        {
            "version": 1,
            "name": "tracked",
            "entrypoint": {"script": "t.py"},
            "resources": {"nodes": 2},
            "checkpoint": {"every_steps": 5},
            "tracking": {"tracking_uri": uri, "mlflow_experiment": "exp", "tags": {"team": "ml"},
                         "register_model": "tiny-lm"},
        }
    )


def _config(attempt: int) -> AgentConfig:
    return AgentConfig(job_id="j-1", attempt=attempt, rank=0, nodes=2, instance_type="p4d.24xlarge")


def test_parent_run_with_a_child_per_attempt_metrics_and_the_final_model(tmp_path: Path, mlflow_uri: str) -> None:
    from mlflow.tracking import MlflowClient

    uri = mlflow_uri
    spec = _spec(uri)
    MlflowClient(tracking_uri=uri).create_experiment("exp", artifact_location=(tmp_path / "artifacts").as_uri())
    attempts = [Attempt(number=1, pool=POOL, started_at=100.0, ended_at=200.0, nodes=2)]
    store = JobOnly(Job(job_id="j-1", name="tracked", status=JobStatus.RUNNING, attempts=attempts))
    first = JobTracking.for_job(_config(1), store.view, spec, store.record)
    assert first is not None and store.job.mlflow_run_id == first.run_id and first.child_id
    first.add_metrics([{"step": 1, "loss": 3.0, "lr": 0.1, "step_s": 0.5}, {"step": 2, "loss": 2.5}])
    first.checkpoint(step=2, duration_s=1.5, emergency=True, stall_s=0.02)
    first.attempt_ended(75, 2, "preempted-saved")

    later = store.job.model_copy(update={"attempts": [*attempts, Attempt(number=2, pool=POOL, nodes=2)],
                                         "steps_lost": 3, "cost_so_far": 12.5, "recoveries": 1})
    second = JobTracking.for_job(_config(2), JobOnly(later).view, spec, JobOnly(later).record)
    assert second is not None and second.run_id == first.run_id and second.child_id != first.child_id
    second.resumed(2)
    second.add_metrics([{"step": 3, "loss": 2.0}])
    manifest = tmp_path / "step-00000004" / "manifest.json"
    manifest.parent.mkdir()
    manifest.write_text(json.dumps({"step": 4}))
    second.attempt_ended(0, 4, "done", manifest, "s3://bucket/checkpoints/j-1/step-00000004", "tiny-lm")

    client = MlflowClient(tracking_uri=uri)
    parent = client.get_run(first.run_id)
    assert parent.data.params["nodes"] == "2" and parent.data.tags["team"] == "ml"
    assert parent.data.params["checkpoint_every_steps"] == "5"
    assert parent.data.params["checkpoint_every_minutes"] == "None"  # (a number or auto when the spec has one)
    assert parent.info.status == "FINISHED"
    loss = client.get_metric_history(first.run_id, "loss")
    assert [(m.step, m.value) for m in loss] == [(1, 3.0), (2, 2.5), (3, 2.0)]
    assert [m.value for m in client.get_metric_history(first.run_id, "exit_code")] == [75, 0]
    assert [(m.step, m.value) for m in client.get_metric_history(first.run_id, "steps_lost")] == [(1, 0.0), (2, 3.0)]
    assert client.get_metric_history(first.run_id, "cost_so_far")[-1].value == 12.5
    assert client.get_metric_history(first.run_id, "downtime_s")  # attempt 2 came after attempt 1 ended
    children = client.search_runs([parent.info.experiment_id],
                                  filter_string=f"tags.`mlflow.parentRunId` = '{first.run_id}'",
                                  order_by=["tags.`spotrelay.attempt` ASC"])
    assert [c.data.tags["mlflow.runName"] for c in children] == ["attempt-1", "attempt-2"]
    one, two = children
    assert one.info.status == "KILLED" and one.data.tags["spotrelay.end_reason"] == "preempted-saved"
    assert one.data.params["pool"] == POOL.key and one.data.params["instance_type"] == "p4d.24xlarge"
    assert one.data.metrics["checkpoint_stall_s"] == 0.02 and one.data.metrics["checkpoint_persist_s"] == 1.5
    assert two.info.status == "FINISHED" and two.data.tags["spotrelay.resumed_from_step"] == "2"
    assert [m.step for m in client.get_metric_history(two.info.run_id, "loss")] == [3]
    assert [a.path for a in client.list_artifacts(first.run_id, "final-checkpoint")] == [
        "final-checkpoint/manifest.json"]
    [version] = client.search_model_versions("name='tiny-lm'")
    assert version.source == "s3://bucket/checkpoints/j-1/step-00000004" and version.run_id == first.run_id

    # what the demo's summary reports from the run
    from spotrelay.local.demo_report import mlflow_lineage

    lineage = mlflow_lineage(uri, first.run_id)
    assert lineage["attempt_runs"] == [("attempt-1", "preempted-saved"), ("attempt-2", "done")]
    assert lineage["loss_points"] == 3 and lineage["loss_steps"] == [1, 3] and lineage["final_manifest_logged"]

    # an agent that restarts mid-attempt finds the same runs (the job lost its run id: found by tag)
    lost = later.model_copy(update={"mlflow_run_id": None})
    again = JobTracking.for_job(_config(2), JobOnly(lost).view, spec, JobOnly(lost).record)
    assert again is not None and (again.run_id, again.child_id) == (first.run_id, second.child_id)


def test_no_tracking_uri_no_mlflow() -> None:
    spec = JobSpec.model_validate(
        {
            "version": 1,
            "name": "n",
            "entrypoint": {"script": "t.py"},
            "resources": {"nodes": 1},
            "checkpoint": {"every_steps": 5},
        }
    )
    job = Job(job_id="j-1", name="n", status=JobStatus.RUNNING)
    assert JobTracking.for_job(_config(1), JobOnly(job).view, spec, JobOnly(job).record) is None


def test_unreachable_tracking_server_never_stops_training(monkeypatch: pytest.MonkeyPatch) -> None:
    job = Job(job_id="j-1", name="n", status=JobStatus.RUNNING)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    spec = _spec("http://127.0.0.1:9/unreachable")
    assert JobTracking.for_job(_config(1), JobOnly(job).view, spec, JobOnly(job).record) is None


def test_a_lost_rank_0s_attempt_run_is_closed_by_the_next_attempt(tmp_path: Path, mlflow_uri: str) -> None:
    """Rank 0 of attempt 1 dies without reporting: its child run would stay RUNNING forever. The next
    attempt's agent ends it with the reason the controller recorded and the attempt's end time."""
    from mlflow.tracking import MlflowClient

    uri = mlflow_uri
    spec = _spec(uri)
    one = Attempt(number=1, pool=POOL, started_at=100.0, nodes=2)
    store = JobOnly(Job(job_id="j-1", name="tracked", status=JobStatus.RUNNING, attempts=[one]))
    first = JobTracking.for_job(_config(1), store.view, spec, store.record)
    assert first is not None and first.child_id
    ended = one.model_copy(update={"ended_at": 250.0, "end_reason": "node-lost"})
    later = store.job.model_copy(update={"attempts": [ended, Attempt(number=2, pool=POOL, nodes=2)]})
    second = JobTracking.for_job(_config(2), JobOnly(later).view, spec, JobOnly(later).record)
    assert second is not None

    client = MlflowClient(tracking_uri=uri)
    orphan, current = client.get_run(first.child_id), client.get_run(second.child_id or "")
    assert orphan.info.status == "KILLED" and orphan.info.end_time == 250_000
    assert orphan.data.tags["spotrelay.end_reason"] == "node-lost (closed by a later attempt)"
    assert current.info.status == "RUNNING"  # its own run is left alone


def test_a_resumed_job_continues_the_stopped_jobs_run(tmp_path: Path, mlflow_uri: str) -> None:
    """``spotrelay resume`` puts the stopped job's run in the new spec's tags: the new job's agent logs
    on that run (one loss curve), its attempts are children named for it, and its lifecycle metrics
    come after the stopped job's attempts."""
    from mlflow.tracking import MlflowClient

    from spotrelay.contracts.agent import RESUMED_FROM_TAG, RESUMED_RUN_TAG

    uri = mlflow_uri
    MlflowClient(tracking_uri=uri).create_experiment("exp", artifact_location=(tmp_path / "artifacts").as_uri())
    one = Attempt(number=1, pool=POOL, started_at=100.0, ended_at=200.0, nodes=2)
    a = JobOnly(Job(job_id="j-1", name="tracked", status=JobStatus.RUNNING, attempts=[one]))
    first = JobTracking.for_job(_config(1), a.view, _spec(uri), a.record)
    assert first is not None
    first.add_metrics([{"step": 1, "loss": 3.0}, {"step": 2, "loss": 2.5}])
    first.attempt_ended(75, 2, "preempted-saved")
    two = Attempt(number=2, pool=POOL, started_at=300.0, nodes=2)
    a2 = JobOnly(a.job.model_copy(update={"attempts": [one, two]}))
    second = JobTracking.for_job(_config(2), a2.view, _spec(uri), a2.record)
    assert second is not None and second.child_id
    second.add_metrics([{"step": 3, "loss": 2.2}])
    second.flush()  # then its rank 0 is lost: the job fails on its budget, its attempt-2 run stays RUNNING

    MlflowClient(tracking_uri=uri).set_terminated(first.run_id, "FAILED")  # (someone closed the failed job's run)
    spec = _spec(uri).model_copy(deep=True)
    spec.tracking.tags.update({RESUMED_FROM_TAG: "j-1", RESUMED_RUN_TAG: first.run_id})
    b = JobOnly(Job(job_id="j-2", name="tracked", status=JobStatus.RUNNING,
                    attempts=[Attempt(number=1, pool=POOL, started_at=900.0, nodes=2)]))
    config = AgentConfig(job_id="j-2", attempt=1, rank=0, nodes=2, instance_type="p4d.24xlarge")
    resumed = JobTracking.for_job(config, b.view, spec, b.record)
    assert resumed is not None and resumed.run_id == first.run_id and b.job.mlflow_run_id == first.run_id
    assert resumed.child_id not in (first.child_id, second.child_id)
    assert MlflowClient(tracking_uri=uri).get_run(first.run_id).info.status == "RUNNING"  # going on again
    resumed.resumed(3)
    resumed.add_metrics([{"step": 4, "loss": 2.0}])
    # its agent restarts mid-attempt: the same child, the same offset
    again = JobTracking.for_job(config, b.view, spec, b.record)
    assert again is not None and again.child_id == resumed.child_id and again.step == 3
    resumed.attempt_ended(0, 4, "done")

    client = MlflowClient(tracking_uri=uri)
    parent = client.get_run(first.run_id)
    assert parent.info.status == "FINISHED" and parent.data.tags["spotrelay.attempts_before.j-2"] == "2"
    assert parent.data.params["job_id"] == "j-1" and parent.data.tags["spotrelay.continued_by"] == "j-2"
    loss = client.get_metric_history(first.run_id, "loss")
    assert sorted((m.step, m.value) for m in loss) == [(1, 3.0), (2, 2.5), (3, 2.2), (4, 2.0)]
    attempts = sorted({(m.step, m.value) for m in client.get_metric_history(first.run_id, "attempt")})  # (a set:
    # the restarted agent logged its attempt again)
    assert attempts == [(1, 1.0), (2, 2.0), (3, 1.0)]  # j-2's attempt 1 is the run's third
    assert [(m.step, m.value) for m in client.get_metric_history(first.run_id, "exit_code")] == [(1, 75.0), (3, 0.0)]
    children = {c.data.tags["mlflow.runName"]: c for c in client.search_runs(
        [parent.info.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{first.run_id}'")}
    assert set(children) == {"attempt-1", "attempt-2", "attempt-1 (j-2)"}
    assert children["attempt-1 (j-2)"].info.status == "FINISHED"
    assert children["attempt-2"].info.status == "RUNNING"  # j-1's, as j-1 left it

    # a run the tracking server does not have (another server, deleted): the job gets its own
    spec.tracking.tags[RESUMED_RUN_TAG] = "0123456789abcdef"
    c = JobOnly(Job(job_id="j-3", name="tracked", status=JobStatus.RUNNING))
    own = JobTracking.for_job(AgentConfig(job_id="j-3", attempt=1, rank=0, nodes=2), c.view, spec, c.record)
    assert own is not None and own.run_id != first.run_id and own.step == 1


def test_the_attempts_end_is_recorded_within_a_bound_and_a_hung_server_does_not_hold_the_exit(
        monkeypatch: pytest.MonkeyPatch, mlflow_uri: str) -> None:
    """rank 0 records the attempt's end before it reports the exit (the controller may terminate the
    instance at the exit); a server that accepts and never answers gives up the wait at the bound."""
    import socket
    import threading

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_uri)
    run_id = client.create_run(client.create_experiment("bound")).info.run_id
    assert JobTracking(client, run_id, 1).end_within(HANG_S, 75, 40, "saved")  # (the bound only catches a hang)
    assert [m.value for m in client.get_metric_history(run_id, "exit_code")] == [75]

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
    with socket.socket() as hung:  # listens, never accepts: each request waits for its timeout
        hung.bind(("127.0.0.1", 0))
        hung.listen(8)
        slow = JobTracking(MlflowClient(tracking_uri=f"http://127.0.0.1:{hung.getsockname()[1]}"), "r-1", 1)
        assert slow.end_within(0.5, 75, 40, "saved") is False
    # the socket is closed: the late calls fail at once (no retries yet); wait for them here, or the thread
    # outlives the test and its warnings meet pytest's closed stream at the interpreter's exit
    for late in [t for t in threading.enumerate() if t.name == "mlflow-attempt-end"]:
        late.join(60)
        assert not late.is_alive()


def test_an_attempt_end_past_the_bound_still_closes_its_own_attempt_run(mlflow_uri: str) -> None:
    """Past end_within's bound a survivor's agent goes on to the next attempt and opens its child run
    while the late calls still wait for the server: they close the attempt that ended, not the new one."""
    import threading

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_uri)
    experiment = client.create_experiment("late")
    parent = client.create_run(experiment).info.run_id
    ended, following = (client.create_run(experiment).info.run_id for _ in range(2))
    gate = threading.Event()

    class SlowServer:  # the real client, its first call held until the next attempt has begun
        def __getattr__(self, name: str) -> Any:
            call = getattr(client, name)

            def held(*args: Any, **kwargs: Any) -> Any:
                gate.wait(60)
                return call(*args, **kwargs)
            return held

    tracking = JobTracking(SlowServer(), parent, 1)
    tracking.child_id = ended
    tracking.add_metrics([{"step": 1, "loss": 2.0}])
    assert tracking.end_within(0.2, 75, 1, "preempted-saved") is False
    tracking.child_id, tracking.attempt = following, 2  # attempt_started for the next gang
    gate.set()
    wait_for(lambda: client.get_run(ended).info.status == "KILLED")
    assert client.get_run(ended).data.tags["spotrelay.end_reason"] == "preempted-saved"
    assert client.get_run(following).info.status == "RUNNING"
    assert [m.step for m in client.get_metric_history(ended, "loss")] == [1]
