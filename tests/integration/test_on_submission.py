"""on_submission fed real-format S3 EventBridge events against moto: valid, invalid, duplicate."""

from __future__ import annotations

import copy
import json
import os
from typing import Any

import pytest

from spotrelay.adapters.aws import client
from spotrelay.adapters.dynamodb_job_store import DynamoDBJobStore
from spotrelay.domain.status import JobStatus
from spotrelay.spec import JobSpec, training_hash
from tests.conftest import ROOT, load_event

PASS_MACHINE = {"StartAt": "Done", "States": {"Done": {"Type": "Pass", "End": True}}}


@pytest.fixture
def env(aws: dict[str, str]) -> dict[str, str]:
    from functions import _runtime
    from spotrelay.settings import reset

    arn = client("stepfunctions").create_state_machine(
        name="spotrelay-job-run", definition=json.dumps(PASS_MACHINE),
        roleArn="arn:aws:iam::123456789012:role/sfn",
    )["stateMachineArn"]
    os.environ["SPOTRELAY_STATE_MACHINE_ARN"] = arn
    reset()
    _runtime.reset()
    return {**aws, "state_machine_arn": arn}


def _drop(bucket: str, key: str, body: bytes) -> dict[str, Any]:
    """Put the object and build the EventBridge event S3 would send for it."""
    etag = client("s3").put_object(Bucket=bucket, Key=key, Body=body)["ETag"].strip('"')
    event = copy.deepcopy(load_event("s3_object_created_submission.json"))
    event["detail"]["bucket"]["name"] = bucket
    event["detail"]["object"].update({"key": key, "etag": etag, "size": len(body)})
    return event


def _invoke(event: dict[str, Any]) -> dict[str, Any]:
    from functions.on_submission import handler
    from spotrelay.local.lambda_seam import LambdaContext

    result: dict[str, Any] = handler(event, LambdaContext("spotrelay-on-submission"))
    return result


def _executions(arn: str) -> list[dict[str, Any]]:
    return list(client("stepfunctions").list_executions(stateMachineArn=arn)["executions"])


def test_valid_submission_creates_job_and_starts_one_execution(env: dict[str, str]) -> None:
    body = (ROOT / "examples" / "tiny.yaml").read_bytes()
    event = _drop(env["bucket"], "submissions/tiny.yaml", body)
    first = _invoke(event)
    assert first["outcome"] == "started"
    job = DynamoDBJobStore().get_job(first["job_id"])
    assert job.status is JobStatus.VALIDATED
    assert job.execution_arn == first["execution_arn"]
    assert job.spec["name"] == "tiny-demo" and len(job.spec_hash) == 64
    assert job.training_hash == training_hash(JobSpec.model_validate(job.spec)) != job.spec_hash
    executions = _executions(env["state_machine_arn"])
    assert [e["name"] for e in executions] == [first["job_id"]]
    exec_input = json.loads(client("stepfunctions").describe_execution(
        executionArn=first["execution_arn"])["input"])
    assert exec_input["job_id"] == first["job_id"]

    # The same event again (at-least-once delivery): nothing new, nothing changed.
    second = _invoke(event)
    assert second["outcome"] == "duplicate" and second["job_id"] == first["job_id"]
    assert DynamoDBJobStore().get_job(first["job_id"]).version == job.version
    assert len(_executions(env["state_machine_arn"])) == 1


def test_invalid_submission_is_rejected_with_field_errors(env: dict[str, str]) -> None:
    body = b"version: 1\nname: bad job!\nentrypoint: {command: [python]}\nresources: {nodes: 0}\n" \
           b"checkpoint: {every_steps: 10}\nsurprise: 1\n"
    event = _drop(env["bucket"], "submissions/bad.yaml", body)
    result = _invoke(event)
    assert result["outcome"] == "rejected"
    job = DynamoDBJobStore().get_job(result["job_id"])
    assert job.status is JobStatus.REJECTED
    report = json.loads(client("s3").get_object(
        Bucket=env["bucket"], Key="submissions/bad.yaml.rejected.json")["Body"].read())
    fields = {e["field"] for e in report["errors"]}
    assert {"name", "resources.nodes", "surprise"} <= fields
    assert _executions(env["state_machine_arn"]) == []
    # the rejection report is itself an Object Created under submissions/: it must be ignored
    echo = _drop(env["bucket"], "submissions/bad.yaml.rejected.json", b"{}")
    assert _invoke(echo)["outcome"] == "ignored"


@pytest.mark.parametrize("body", [b"\x00\xff not yaml: [", b"- a\n- list\n", b"!!python/object:os.system {}\n"])
def test_garbage_never_crashes_and_never_touches_existing_jobs(env: dict[str, str], body: bytes) -> None:
    good = _invoke(_drop(env["bucket"], "submissions/tiny.yaml", (ROOT / "examples" / "tiny.yaml").read_bytes()))
    before = DynamoDBJobStore().get_job(good["job_id"])
    result = _invoke(_drop(env["bucket"], "submissions/garbage.yaml", body))
    assert result["outcome"] == "rejected"
    assert DynamoDBJobStore().get_job(good["job_id"]) == before


def test_oversized_submission_is_rejected_without_reading(env: dict[str, str]) -> None:
    body = b"# " + b"x" * (300 * 1024)
    result = _invoke(_drop(env["bucket"], "submissions/huge.yaml", body))
    assert result["outcome"] == "rejected"
    assert "limit" in result["reasons"][0]


def test_crash_before_start_is_healed_by_redelivery(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    from functions import _runtime

    event = _drop(env["bucket"], "submissions/tiny.yaml", (ROOT / "examples" / "tiny.yaml").read_bytes())
    wf = _runtime.workflow()

    def boom(job_id: str, payload: dict[str, Any]) -> str:
        raise RuntimeError("lambda timed out")

    monkeypatch.setattr(wf, "start", boom)
    with pytest.raises(RuntimeError):
        _invoke(event)
    monkeypatch.undo()
    result = _invoke(event)
    assert result["outcome"] == "started"
    assert len(_executions(env["state_machine_arn"])) == 1


def test_other_prefixes_are_ignored(env: dict[str, str]) -> None:
    result = _invoke(_drop(env["bucket"], "checkpoints/x/manifest.json", b"{}"))
    assert result["outcome"] == "ignored"


@pytest.mark.parametrize(("roots", "prefix", "outcome"), [
    ("", "s3://{bucket}/checkpoints/team/run-1/", "started"),  # the jobs bucket's: the default root
    ("", "s3://team-bucket/ckpt/", "rejected"),
    ("s3://{bucket}/checkpoints/,s3://data-uw2/checkpoints/", "s3://data-uw2/checkpoints/run-1", "started"),
    ("s3://{bucket}/checkpoints/,s3://data-uw2/checkpoints/", "s3://{bucket}/checkpoints/*/", "rejected"),
])
def test_a_checkpoint_prefix_the_nodes_could_not_write_is_rejected(
        env: dict[str, str], monkeypatch: pytest.MonkeyPatch, roots: str, prefix: str, outcome: str) -> None:
    """The agent roles' boundary lets a node write only under a deployment bucket's checkpoints/: a job
    pointed elsewhere would pay for a gang that fails its first save. It ends as a rejection instead."""
    import dataclasses

    from spotrelay.services import submit
    from spotrelay.settings import settings

    listed = tuple(r for r in roots.format(bucket=env["bucket"]).split(",") if r)
    placed = dataclasses.replace(settings(), checkpoint_roots=listed or settings().checkpoint_roots)
    monkeypatch.setattr(submit, "settings", lambda: placed)
    body = (ROOT / "examples" / "tiny.yaml").read_text()
    doc = body.replace("checkpoint:\n", f"checkpoint:\n  s3_prefix: {prefix.format(bucket=env['bucket'])}\n", 1)
    assert "s3_prefix:" in doc
    result = _invoke(_drop(env["bucket"], "submissions/placed.yaml", doc.encode()))
    assert result["outcome"] == outcome, result
    if outcome == "rejected":
        report = json.loads(client("s3").get_object(
            Bucket=env["bucket"], Key="submissions/placed.yaml.rejected.json")["Body"].read())
        assert [e["field"] for e in report["errors"]] == ["checkpoint.s3_prefix"]


def test_the_checkpoint_roots_come_from_the_stack_else_the_jobs_bucket(aws: dict[str, str]) -> None:
    from spotrelay.settings import reset, settings

    assert settings().checkpoint_roots == (f"s3://{aws['bucket']}/checkpoints/",)
    os.environ["SPOTRELAY_CHECKPOINT_ROOTS"] = " s3://a/checkpoints/, s3://b/checkpoints/ ,"
    try:
        reset()
        assert settings().checkpoint_roots == ("s3://a/checkpoints/", "s3://b/checkpoints/")
    finally:
        del os.environ["SPOTRELAY_CHECKPOINT_ROOTS"]
        reset()


def test_a_dataset_the_nodes_could_not_read_is_rejected(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """On AWS the stack lists where datasets may be (the data buckets' data/, its dataset_buckets)."""
    import dataclasses

    from spotrelay.services import submit
    from spotrelay.settings import settings

    placed = dataclasses.replace(settings(), dataset_roots=("s3://acme-ml-data/", "s3://spotrelay-data-1-us-west-2/data/"))
    monkeypatch.setattr(submit, "settings", lambda: placed)
    tiny = (ROOT / "examples" / "tiny.yaml").read_text()
    ok = tiny + "dataset:\n  uri: s3://acme-ml-data/corpus/\n"
    assert _invoke(_drop(env["bucket"], "submissions/ok.yaml", ok.encode()))["outcome"] == "started"
    bad = tiny + "dataset:\n  uri: s3://acme-ml-data/corpus/\n  replicas:\n    us-west-2: s3://elsewhere/corpus/\n"
    result = _invoke(_drop(env["bucket"], "submissions/bad.yaml", bad.encode()))
    assert result["outcome"] == "rejected"
    report = json.loads(client("s3").get_object(
        Bucket=env["bucket"], Key="submissions/bad.yaml.rejected.json")["Body"].read())
    assert [e["field"] for e in report["errors"]] == ["dataset.replicas.us-west-2"]
    assert "dataset_buckets" in report["errors"][0]["message"]


def test_dataset_fsx_on_a_deployment_without_fsx_is_rejected(env: dict[str, str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses

    from spotrelay.services import submit
    from spotrelay.settings import settings

    spec = (ROOT / "examples" / "tiny.yaml").read_text() + "dataset:\n  uri: s3://data-b/data/x/\n  fsx: {}\n"
    for enabled, outcome, key in ((False, "rejected", "submissions/no-fsx.yaml"),
                                  (True, "started", "submissions/fsx.yaml")):
        placed = dataclasses.replace(settings(), fsx_enabled=enabled)
        monkeypatch.setattr(submit, "settings", lambda placed=placed: placed)
        result = _invoke(_drop(env["bucket"], key, spec.encode()))
        assert result["outcome"] == outcome, (enabled, result)
    report = json.loads(client("s3").get_object(
        Bucket=env["bucket"], Key="submissions/no-fsx.yaml.rejected.json")["Body"].read())
    assert [e["field"] for e in report["errors"]] == ["dataset.fsx"]


def test_a_submission_deleted_before_it_was_read_is_rejected_as_deleted_on_a_conditioned_listing(
        env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The handler's role may list only ``submissions/`` (cdk/permissions.py), so S3 answers the read of a
    deleted submission with 403, not 404. It used to end as a rejection naming AccessDenied; the store
    now lists that one key and says the file was deleted."""
    from spotrelay.adapters.s3_object_store import S3ObjectStore
    from tests.integration.s3_as_aws import ConditionedListing

    monkeypatch.setattr(S3ObjectStore, "_s3", property(lambda self: ConditionedListing(client("s3"))))
    event = _drop(env["bucket"], "submissions/gone.yaml", (ROOT / "examples" / "tiny.yaml").read_bytes())
    client("s3").delete_object(Bucket=env["bucket"], Key="submissions/gone.yaml")
    result = _invoke(event)
    assert result["outcome"] == "rejected"
    report = json.loads(client("s3").get_object(
        Bucket=env["bucket"], Key="submissions/gone.yaml.rejected.json")["Body"].read())
    assert "was deleted before it could be read" in json.dumps(report), report


def test_a_submission_that_is_there_but_denied_stays_a_denial(env: dict[str, str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A 403 on a key the listing shows is a real denial: never read as "deleted"."""
    from botocore.exceptions import ClientError

    from spotrelay.adapters.s3_object_store import S3ObjectStore
    from spotrelay.errors import NotFoundError
    from tests.integration.s3_as_aws import ConditionedListing

    class Denied(ConditionedListing):
        def get_object(self, **kwargs: Any) -> Any:
            raise ClientError({"Error": {"Code": "AccessDenied", "Message": "Access Denied"}}, "GetObject")

    class Unlisted(ConditionedListing):  # a caller that may not list either: the denial stands
        def list_objects_v2(self, **kwargs: Any) -> Any:
            raise ClientError({"Error": {"Code": "AccessDenied", "Message": "Access Denied"}}, "ListObjectsV2")

    client("s3").put_object(Bucket=env["bucket"], Key="submissions/there.yaml", Body=b"x")
    monkeypatch.setattr(S3ObjectStore, "_s3", property(lambda self: Denied(client("s3"))))
    with pytest.raises(ClientError):
        S3ObjectStore().get("submissions/there.yaml")
    monkeypatch.setattr(S3ObjectStore, "_s3", property(lambda self: Unlisted(client("s3"))))
    with pytest.raises(ClientError):
        S3ObjectStore().get("submissions/missing.yaml")
    monkeypatch.setattr(S3ObjectStore, "_s3", property(lambda self: ConditionedListing(client("s3"))))
    with pytest.raises(NotFoundError):
        S3ObjectStore().get("submissions/missing.yaml")
    assert S3ObjectStore().get("submissions/there.yaml") == b"x"
