"""``spotrelay resume JOB``: a stopped job goes on from its newest checkpoint as a new submission that
the controller takes like any other (moto: the CLI's upload, then on_submission on that object)."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from spotrelay.adapters.aws import client
from spotrelay.adapters.dynamodb_job_store import DynamoDBJobStore
from spotrelay.cli.main import app
from spotrelay.contracts.agent import RESUMED_FROM_TAG, RESUMED_RUN_TAG
from spotrelay.domain.status import JobStatus
from spotrelay.resources import RESOURCES
from tests.conftest import ROOT, load_event
from tests.integration.test_on_submission import _drop, _invoke, env

__all__ = ["env"]
runner = CliRunner()


def _submitted(bucket: str, key: str = "tiny.yaml") -> str:
    body = (ROOT / "examples" / "tiny.yaml").read_bytes()
    result = _invoke(_drop(bucket, f"{RESOURCES.submissions_prefix}{key}", body))
    assert result["outcome"] == "started"
    return str(result["job_id"])


def _stop(job_id: str, status: JobStatus = JobStatus.FAILED, cost: float = 412.5) -> None:
    DynamoDBJobStore().update_job(job_id, lambda j: j.model_copy(update={
        "status": status, "cost_so_far": cost, "reasons": ["budget: spent $412.50 of the $400.00 budget"],
        "mlflow_run_id": "run-of-the-stopped-job"}))


def _new_objects(bucket: str, seen: set[str]) -> list[dict[str, Any]]:
    listed = client("s3").list_objects_v2(Bucket=bucket, Prefix=RESOURCES.submissions_prefix).get("Contents", [])
    return [o for o in listed if o["Key"] not in seen]


def test_a_stopped_job_goes_on_from_its_checkpoints_as_a_new_job(env: dict[str, str]) -> None:
    bucket = env["bucket"]
    old_id = _submitted(bucket)
    old = DynamoDBJobStore().get_job(old_id)
    _stop(old_id)
    location = f"s3://{bucket}/{RESOURCES.checkpoints_prefix}{old_id}"
    client("s3").put_object(Bucket=bucket, Key=f"{RESOURCES.checkpoints_prefix}{old_id}/step-00000040/manifest.json",
                            Body=json.dumps({"step": 40, "shards": []}).encode())
    seen = {o["Key"] for o in _new_objects(bucket, set())}
    result = runner.invoke(app, ["resume", old_id, "--budget", "900"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert f"resuming {old_id} from step 40 (its newest checkpoint), checkpoints in {location}" in text
    assert "budget $900.00 for the new job (the stopped one spent $412.50)" in text
    [obj] = _new_objects(bucket, seen)
    spec = json.loads(client("s3").get_object(Bucket=bucket, Key=obj["Key"])["Body"].read())
    assert spec["checkpoint"]["s3_prefix"] == location and spec["budget"]["max_total_cost"] == 900
    assert spec["tracking"]["tags"][RESUMED_FROM_TAG] == old_id
    assert spec["tracking"]["tags"][RESUMED_RUN_TAG] == "run-of-the-stopped-job"  # its agent continues that run
    # the controller takes it like any submission; its training definition is the stopped job's, so its
    # agent resumes the checkpoints there (checkpoints.md)
    event = copy.deepcopy(load_event("s3_object_created_submission.json"))  # S3's event for the CLI's upload
    event["detail"]["bucket"]["name"] = bucket
    event["detail"]["object"].update({"key": obj["Key"], "etag": obj["ETag"].strip('"'), "size": obj["Size"]})
    taken = _invoke(event)
    assert taken["outcome"] == "started" and result.stdout.strip().splitlines()[-1] == taken["job_id"]
    new = DynamoDBJobStore().get_job(taken["job_id"])
    assert new.training_hash == old.training_hash and new.spec_hash != old.spec_hash
    # a second resume of the same job while the first one lives is refused: one writer per location
    again = runner.invoke(app, ["resume", old_id])
    assert again.exit_code == 1 and len(again.output.strip().splitlines()) == 1
    assert f"job {taken['job_id']} (VALIDATED) already resumes {old_id}" in again.output


def test_what_cannot_be_resumed_is_one_line(env: dict[str, str]) -> None:
    bucket = env["bucket"]
    live = _submitted(bucket)
    result = runner.invoke(app, ["resume", live])
    assert result.exit_code == 1 and "is VALIDATED; cancel it first" in result.output
    _stop(live, JobStatus.SUCCEEDED)
    result = runner.invoke(app, ["resume", live])
    assert result.exit_code == 1 and "succeeded; nothing to resume" in result.output
    stopped = _submitted(bucket, "other.yaml")
    _stop(stopped, JobStatus.CANCELLED)
    for bad in ("0", "-5", "nan", "inf"):
        result = runner.invoke(app, ["resume", stopped, "--budget", bad])
        assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
        assert "--budget: budget.max_total_cost" in result.output
    for bad in ("-5", "nan"):  # before any AWS call: a bad amount is not reported as a connection problem
        result = runner.invoke(app, ["resume", stopped, "--budget", bad, "--endpoint-url", "http://127.0.0.1:1"])
        assert result.exit_code == 2 and "--budget: budget.max_total_cost" in result.output, result.output
    result = runner.invoke(app, ["resume", "no-such-job"])
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1, result.output
    # nothing was submitted by any refusal (the two tiny jobs' own objects only)
    assert len(_new_objects(bucket, set())) == 2


def _edited(tmp_path: Path, change: Callable[[str], str], name: str = "edited.yaml") -> Path:
    path = tmp_path / name
    path.write_text(change((ROOT / "examples" / "tiny.yaml").read_text()))
    return path


def test_resume_with_an_edited_spec_that_trains_the_same(env: dict[str, str], tmp_path: Path) -> None:
    """--spec: more regions, a new cadence and budget run on; the training definition is the stopped job's."""
    bucket = env["bucket"]
    old_id = _submitted(bucket)
    old = DynamoDBJobStore().get_job(old_id)
    _stop(old_id, JobStatus.CANCELLED)
    location = f"s3://{bucket}/{RESOURCES.checkpoints_prefix}{old_id}"
    wider = _edited(tmp_path, lambda s: s.replace("regions: [us-east-1, us-west-2]",
                                                  "regions: [us-east-1, us-west-2, eu-west-1]")
                    .replace("every_steps: 10", "every_steps: 5").replace("max_total_cost: 500", "max_total_cost: 800"))
    seen = {o["Key"] for o in _new_objects(bucket, set())}
    result = runner.invoke(app, ["resume", old_id, "--spec", str(wider)])
    assert result.exit_code == 0, result.output
    assert "budget $800.00 for the new job" in " ".join(result.output.split())
    [obj] = _new_objects(bucket, seen)
    spec = json.loads(client("s3").get_object(Bucket=bucket, Key=obj["Key"])["Body"].read())
    assert spec["resources"]["regions"] == ["us-east-1", "us-west-2", "eu-west-1"]
    assert spec["checkpoint"]["every_steps"] == 5 and spec["checkpoint"]["s3_prefix"] == location
    assert spec["budget"]["max_total_cost"] == 800 and spec["tracking"]["tags"][RESUMED_FROM_TAG] == old_id
    event = copy.deepcopy(load_event("s3_object_created_submission.json"))
    event["detail"]["bucket"]["name"] = bucket
    event["detail"]["object"].update({"key": obj["Key"], "etag": obj["ETag"].strip('"'), "size": obj["Size"]})
    taken = _invoke(event)
    assert taken["outcome"] == "started"
    assert DynamoDBJobStore().get_job(taken["job_id"]).training_hash == old.training_hash


def test_an_edited_spec_that_trains_something_else_is_refused_in_one_line(env: dict[str, str], tmp_path: Path) -> None:
    bucket = env["bucket"]
    old_id = _submitted(bucket)
    _stop(old_id)
    other_steps = _edited(tmp_path, lambda s: s.replace('--steps, "60"', '--steps, "90"'))
    result = runner.invoke(app, ["resume", old_id, "--spec", str(other_steps)])
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1, result.output
    assert f"trains something else than job {old_id} (entrypoint.args differ)" in " ".join(result.output.split())
    elsewhere = _edited(tmp_path, lambda s: s.replace("  local_dir: .cache/twin-checkpoints",
                                                      "  local_dir: .cache/twin-checkpoints\n"
                                                      "  s3_prefix: s3://other-bucket/ckpt"), "elsewhere.yaml")
    result = runner.invoke(app, ["resume", old_id, "--spec", str(elsewhere)])
    assert result.exit_code == 1 and "checkpoint.s3_prefix: resume goes on from s3://" in result.output
    broken = _edited(tmp_path, lambda s: s.replace("nodes: 2", "nodes: two"), "broken.yaml")
    result = runner.invoke(app, ["resume", old_id, "--spec", str(broken)])
    assert result.exit_code == 2 and "broken.yaml" in result.output and "resources.nodes" in result.output
    assert "Traceback" not in result.output
    result = runner.invoke(app, ["resume", old_id, "--spec", str(tmp_path / "job.txt")])
    assert result.exit_code != 0 and len(result.output.strip().splitlines()) == 1, result.output
    assert len(_new_objects(bucket, set())) == 1  # nothing was submitted by any refusal


def test_a_stored_spec_that_no_longer_validates_resumes_with_the_users_file(env: dict[str, str],
                                                                            tmp_path: Path) -> None:
    """A record from another release whose spec this one refuses: resume says so in one line and points
    at --spec; with the user's file it goes on when that trains what the job's training hash says."""
    bucket = env["bucket"]
    old_id = _submitted(bucket)
    _stop(old_id, JobStatus.CANCELLED)
    DynamoDBJobStore().update_job(old_id, lambda j: j.model_copy(update={
        "spec": {**j.spec, "resources": {**j.spec["resources"], "gpu_kind": "h100"}}}))  # (a field from elsewhere)
    result = runner.invoke(app, ["resume", old_id])
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1, result.output
    assert (f"job {old_id}'s stored spec no longer validates (resources.gpu_kind: unknown field); resume it with "
            "--spec FILE") in " ".join(result.output.split())
    other_steps = _edited(tmp_path, lambda s: s.replace('--steps, "60"', '--steps, "90"'))
    result = runner.invoke(app, ["resume", old_id, "--spec", str(other_steps)])  # checked by the training hash
    assert result.exit_code == 1 and f"trains something else than job {old_id}" in result.output
    seen = {o["Key"] for o in _new_objects(bucket, set())}
    result = runner.invoke(app, ["resume", old_id, "--spec", str(ROOT / "examples" / "tiny.yaml")])
    assert result.exit_code == 0, result.output
    [obj] = _new_objects(bucket, seen)
    spec = json.loads(client("s3").get_object(Bucket=bucket, Key=obj["Key"])["Body"].read())
    assert spec["tracking"]["tags"][RESUMED_FROM_TAG] == old_id and "gpu_kind" not in spec["resources"]


def test_checkpoints_that_cannot_be_listed_are_not_called_none(env: dict[str, str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A person without the listing (another account's bucket, a narrower policy) read "from step 0: no
    checkpoint was saved", though the new job's nodes, with their own role, resume the newest one."""
    from botocore.exceptions import ClientError

    from spotrelay.adapters.s3_object_store import S3ObjectStore

    old_id = _submitted(env["bucket"])
    _stop(old_id)

    def denied(self: object, prefix: str) -> list[str]:
        raise ClientError({"Error": {"Code": "AccessDenied", "Message": "Access Denied"}}, "ListObjectsV2")

    monkeypatch.setattr(S3ObjectStore, "list_keys", denied)
    result = runner.invoke(app, ["resume", old_id])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "from its newest checkpoint (they could not be listed here: AccessDenied: " in text, text
    assert "no checkpoint was saved" not in text
