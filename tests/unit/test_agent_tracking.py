"""MLflow: one run per job, resumed across attempts (run id on the job record, or found by tag)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from agent.config import AgentConfig
from agent.reporting import JobTracking
from spotrelay.domain.models import Job
from spotrelay.domain.status import JobStatus
from spotrelay.spec.models import JobSpec


class JobOnly:
    def __init__(self, job: Job) -> None:
        self.job = job

    def update_job(self, job_id: str, change: Callable[[Job], Job | None], attempts: int = 3) -> Job | None:
        updated = change(self.job)
        if updated is not None:
            self.job = updated
        return updated


def _spec(uri: str) -> JobSpec:
    return JobSpec.model_validate(
        {
            "version": 1,
            "name": "tracked",
            "entrypoint": {"script": "t.py"},
            "resources": {"nodes": 2},
            "checkpoint": {"every_steps": 5},
            "tracking": {"tracking_uri": uri, "mlflow_experiment": "exp", "tags": {"team": "ml"}},
        }
    )


def _config(attempt: int) -> AgentConfig:
    return AgentConfig(job_id="j-1", attempt=attempt, rank=0, nodes=2, instance_type="p5.48xlarge")


def test_one_run_per_job_across_attempts(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    spec = _spec(uri)
    store = JobOnly(Job(job_id="j-1", name="tracked", status=JobStatus.RUNNING))
    first = JobTracking.for_job(_config(1), store.job, spec, store)  # type: ignore[arg-type]
    assert first is not None and store.job.mlflow_run_id == first.run_id
    first.checkpoint(step=7, duration_s=1.5, emergency=True)
    first.attempt_ended(75, 7)

    second = JobTracking.for_job(_config(2), store.job, spec, store)  # type: ignore[arg-type]
    assert second is not None and second.run_id == first.run_id
    second.attempt_ended(0, 20)

    # the job record lost the id (a lost write): the run is found again by its tag
    lost = store.job.model_copy(update={"mlflow_run_id": None})
    third = JobTracking.for_job(_config(3), lost, spec, JobOnly(lost))  # type: ignore[arg-type]
    assert third is not None and third.run_id == first.run_id

    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(first.run_id)
    assert run.data.params["nodes"] == "2" and run.data.tags["team"] == "ml"
    assert [m.value for m in client.get_metric_history(first.run_id, "exit_code")] == [75, 0]
    assert run.info.status == "FINISHED"
    assert len(client.search_runs([run.info.experiment_id])) == 1


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
    assert JobTracking.for_job(_config(1), job, spec, JobOnly(job)) is None  # type: ignore[arg-type]


def test_unreachable_tracking_server_never_stops_training(monkeypatch: pytest.MonkeyPatch) -> None:
    job = Job(job_id="j-1", name="n", status=JobStatus.RUNNING)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    spec = _spec("http://127.0.0.1:9/unreachable")
    assert JobTracking.for_job(_config(1), job, spec, JobOnly(job)) is None  # type: ignore[arg-type]
