"""``spotrelay cancel --save`` then ``spotrelay resume`` in the local twin: a training job cancelled
with a save stops at that step; it goes on as a new job from that checkpoint in S3 (the new nodes'
local disks are empty) and ends with the model an uninterrupted run ends with, bit for bit. The new
job's spec differs from the old one's (its checkpoint location, a budget, a tag): the training hash
lets its trainers take the checkpoint. The cancelled job is tracked in MLflow (a SQLite store): the
resumed job continues its run, one loss curve from step 1 to the last."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from spotrelay.adapters.dynamodb_job_store import DynamoDBJobStore
from spotrelay.adapters.s3_object_store import S3ObjectStore
from spotrelay.adapters.sfn_workflow import SfnWorkflow
from spotrelay.domain.models import Job
from spotrelay.local.code_delivery import deliver_script_dir
from spotrelay.local.demo_report import ensure_experiment, mlflow_lineage
from spotrelay.local.reference import read_results
from spotrelay.local.twin import Twin
from spotrelay.resources import RESOURCES
from spotrelay.services.cancel import request_cancel
from spotrelay.services.describe import checkpoint_location, checkpoints
from spotrelay.services.resume import RESUMED_FROM_TAG, resume_spec
from spotrelay.settings import settings
from tests.e2e.test_twin_health import twin  # the same small twin: code through S3, reconcile every 5 s
from tests.e2e.waits import wait_for, wait_terminal
from tests.integration.torchrun import result, torchrun

ROOT = Path(__file__).resolve().parents[2]
STEPS, EVERY = 60, 5

__all__ = ["twin"]
pytestmark = pytest.mark.slow


def _spec(tracking_uri: str | None = None) -> str:
    data = yaml.safe_load((ROOT / "examples" / "tiny.yaml").read_text())
    # slow enough that the cancel (a directive the agents poll every 5 s) comes long before the last step
    data["entrypoint"]["args"] = ["--engine", "ddp", "--steps", str(STEPS), "--step-sleep", "1.0", "--out", "result"]
    data["checkpoint"]["every_steps"] = EVERY
    data.pop("tracking", None)
    if tracking_uri is not None:
        data["tracking"] = {"tracking_uri": tracking_uri, "mlflow_experiment": "resume"}
    return yaml.safe_dump(data)


def test_a_cancelled_job_resumes_as_a_new_job_bit_identical(twin: Twin, tmp_path: Path) -> None:
    assert twin.compute is not None
    store = DynamoDBJobStore()
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    ensure_experiment(uri, "resume", tmp_path / "mlartifacts")
    key = twin.submit(deliver_script_dir(_spec(uri), ROOT), "first.yaml")
    # a periodic checkpoint is committed: then the user cancels with a save
    first = wait_for(lambda: (j := twin.job_for_key(key)) is not None and j.last_checkpoint is not None
                     and j.last_checkpoint.step >= EVERY and j, "the first job did not save")
    asked = request_cancel(first.job_id, store=store, workflow=SfnWorkflow(), now=time.time(), reason="test",
                           save_s=600)
    assert asked.stop_save_by is not None
    stopped = wait_terminal(twin, key)
    assert stopped.status.value == "CANCELLED"
    resumed = _resume_bit_identical(twin, stopped, tmp_path)
    # one MLflow run across both jobs: the resumed job's agent continued the cancelled job's
    assert stopped.mlflow_run_id and resumed.mlflow_run_id == stopped.mlflow_run_id
    lineage = mlflow_lineage(uri, stopped.mlflow_run_id)
    assert lineage["loss_steps"] == [1, STEPS] and lineage["final_manifest_logged"]
    names = [name for name, _ in lineage["attempt_runs"]]
    assert "attempt-1" in names and f"attempt-1 ({resumed.job_id})" in names


def test_a_job_its_budget_stopped_saved_first_and_resumes_bit_identical(twin: Twin, tmp_path: Path) -> None:
    """The budget is spent while the gang trains: the reconcile sweep (every 5 s here) stops it, the
    ranks save at their next step, the job ends FAILED on the budget, and a resume with a new budget
    goes on from that save. (Plan launches only a gang the budget pays to boot and save, and the
    twin's prices are a model: the test lowers the job record's budget below what it has spent once a
    checkpoint is committed, so the moment does not hang on the machine's speed.)"""
    data = yaml.safe_load(_spec())
    data["budget"] = {"max_total_cost": 1000.0}
    key = twin.submit(deliver_script_dir(yaml.safe_dump(data), ROOT), "capped.yaml")
    running = wait_for(lambda: (j := twin.job_for_key(key)) is not None and j.last_checkpoint is not None
                       and j.last_checkpoint.step >= EVERY and j, "the job did not save")
    DynamoDBJobStore().update_job(running.job_id, lambda j: j.model_copy(update={
        "spec": {**j.spec, "budget": {**j.spec["budget"], "max_total_cost": 0.01}}}))
    stopped = wait_terminal(twin, key)
    assert stopped.status.value == "FAILED", (stopped.reasons, stopped.attempts)
    assert any(r.startswith("budget: spent $") for r in stopped.reasons), stopped.reasons
    _resume_bit_identical(twin, stopped, tmp_path)


def _resume_bit_identical(twin: Twin, stopped: Job, tmp_path: Path) -> Job:
    """The stopped job's newest checkpoint is the save its stop asked for; ``resume`` goes on from it on
    fresh nodes and ends with the uninterrupted run's model, bit for bit."""
    assert twin.compute is not None and stopped.last_checkpoint is not None
    store = DynamoDBJobStore()
    saved = stopped.last_checkpoint.step
    assert 0 < saved < STEPS
    bucket, prefix = checkpoint_location(stopped, settings().bucket, RESOURCES.checkpoints_prefix)
    # the newest is the save the stop asked for (a request id; the periodic ones have none)
    newest = checkpoints(S3ObjectStore(bucket), prefix)[-1]
    assert newest.step == saved and newest.requested
    spec = resume_spec(stopped, f"s3://{bucket}/{prefix}".rstrip("/"), [], budget=500.0)
    again = twin.submit(json.dumps(spec.model_dump(mode="json")), f"resumed-{stopped.job_id}.json")
    job = wait_terminal(twin, again)
    assert job.status.value == "SUCCEEDED", (job.reasons, job.attempts)
    assert job.spec["tracking"]["tags"][RESUMED_FROM_TAG] == stopped.job_id and job.spec_hash != stopped.spec_hash
    assert job.training_hash == stopped.training_hash
    # it went on from the stop's save: no step of the stopped job is trained again
    assert job.attempts[0].resumed_from_step == saved

    torchrun(ROOT / "examples" / "tiny" / "train.py", tmp_path, "reference", tmp_path / "ckpt-ref",
             ["--engine", "ddp", "--steps", str(STEPS)])
    served = {(n.attempt, n.rank): n.instance_id for n in store.nodes_of(job.job_id) if not n.spare}
    disks = {li.instance.instance_id: li.work_dir for li in twin.compute.instances()}
    final = read_results(disks[served[(job.attempt, 0)]] / "result")[0]
    assert final["exit"] == 0 and final["state_sha256"] == result(tmp_path, "reference", 0)["state_sha256"]
    return job
