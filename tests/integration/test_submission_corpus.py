"""Every hostile file dropped through the real submission handler against moto ends as a rejection
that names its field or cause, and nothing stays SUBMITTED or VALIDATED; failures on the way are
retried a bounded number of times and then end the submission with the error as the cause."""

from __future__ import annotations

import json
from typing import Any

import pytest

from spotrelay.adapters.aws import client
from spotrelay.adapters.dynamodb_job_store import DynamoDBJobStore
from spotrelay.domain.status import JobStatus
from spotrelay.services import submit as submit_service
from tests.conftest import ROOT
from tests.hostile_corpus import EXPECT, corpus
from tests.integration.test_on_submission import _drop, _executions, _invoke, env

__all__ = ["env"]
TINY = (ROOT / "examples" / "tiny.yaml").read_bytes()


def _report(bucket: str, key: str) -> dict[str, Any]:
    body = client("s3").get_object(Bucket=bucket, Key=key)["Body"].read()
    report: dict[str, Any] = json.loads(body)
    return report


def test_every_hostile_file_ends_as_a_rejection_naming_its_cause(env: dict[str, str]) -> None:
    results = {}
    for name, body in corpus().items():
        results[name] = _invoke(_drop(env["bucket"], f"submissions/hostile/{name}", body))
    assert {name: r["outcome"] for name, r in results.items() if r["outcome"] != "rejected"} == {}
    for name, result in results.items():
        assert EXPECT[name] in " ".join(result["reasons"]), name
        report = _report(env["bucket"], f"submissions/hostile/{name}.rejected.json")
        assert report["status"] == "REJECTED" and report["job_id"] == result["job_id"]
        assert all(e["field"] and e["message"] for e in report["errors"])
    store = DynamoDBJobStore()
    assert store.jobs_by_status(JobStatus.SUBMITTED) == [] and store.jobs_by_status(JobStatus.VALIDATED) == []
    assert len(store.jobs_by_status(JobStatus.REJECTED)) == len(results)
    assert _executions(env["state_machine_arn"]) == []


def test_an_empty_object_reads_as_empty_not_as_an_s3_error(env: dict[str, str]) -> None:
    """S3 answers a Range request on an empty object with 416; the event's size may be missing."""
    from functions import _runtime

    client("s3").put_object(Bucket=env["bucket"], Key="submissions/empty.yaml", Body=b"")
    assert _runtime.objects().get("submissions/empty.yaml", max_bytes=1024) == b""
    ports = _runtime.controller()
    result = submit_service.submit("submissions/empty.yaml", "etag-1", None, store=ports.store,
                                   objects=_runtime.objects(), workflow=ports.workflow, now=1.0)
    assert result.outcome == "rejected" and "is empty" in result.reasons[0]


def test_the_same_file_dropped_again_gets_a_duplicate_note(env: dict[str, str]) -> None:
    event = _drop(env["bucket"], "submissions/tiny.yaml", TINY)
    first = _invoke(event)
    assert first["outcome"] == "started"
    # the same event again (a redelivery): no note
    assert _invoke(event)["outcome"] == "duplicate"
    note = "submissions/tiny.yaml.duplicate.json"
    with pytest.raises(client("s3").exceptions.NoSuchKey):
        client("s3").get_object(Bucket=env["bucket"], Key=note)
    # the same bytes written again: a new sequencer, the same job
    again = _drop(env["bucket"], "submissions/tiny.yaml", TINY)
    again["detail"]["object"]["sequencer"] = "0A1B2C3D4E5F000000"
    result = _invoke(again)
    assert result["outcome"] == "duplicate" and result["job_id"] == first["job_id"]
    assert _report(env["bucket"], note)["duplicate_of"] == first["job_id"]
    assert len(_executions(env["state_machine_arn"])) == 1
    # and the note itself is not a submission
    assert _invoke(_drop(env["bucket"], note, b"{}"))["outcome"] == "ignored"


def test_a_failure_on_the_way_is_retried_then_ends_the_submission_with_its_cause(
        env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    from functions import _runtime

    def broken(job_id: str, payload: dict[str, Any]) -> str:
        raise RuntimeError("state machine deleted")

    monkeypatch.setattr(_runtime.workflow(), "start", broken)
    event = _drop(env["bucket"], "submissions/tiny.yaml", TINY)
    for _ in range(submit_service.MAX_TRIES - 1):
        with pytest.raises(RuntimeError):
            _invoke(event)  # the Lambda's own retry, or reconcile's sweep, comes back
    result = _invoke(event)
    assert result["outcome"] == "failed" and "RuntimeError: state machine deleted" in result["reasons"][0]
    job = DynamoDBJobStore().get_job(result["job_id"])
    assert job.status is JobStatus.FAILED and job.submit_tries == submit_service.MAX_TRIES
    report = _report(env["bucket"], "submissions/tiny.yaml.rejected.json")
    assert report["status"] == "FAILED" and report["errors"][0]["field"] == "(controller)"


def test_a_failure_before_validation_ends_as_a_rejection(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    from functions import _runtime

    def unreadable(key: str, max_bytes: int | None = None) -> bytes:
        raise ConnectionError("endpoint reset")

    monkeypatch.setattr(_runtime.objects(), "get", unreadable)
    event = _drop(env["bucket"], "submissions/tiny.yaml", TINY)
    for _ in range(submit_service.MAX_TRIES - 1):
        with pytest.raises(ConnectionError):
            _invoke(event)
    result = _invoke(event)
    assert result["outcome"] == "rejected" and "ConnectionError: endpoint reset" in result["reasons"][0]
    assert DynamoDBJobStore().get_job(result["job_id"]).status is JobStatus.REJECTED


def test_a_dropped_spec_must_name_an_s3_archive_for_its_code(env: dict[str, str]) -> None:
    local = TINY.replace(b"  working_dir: .\n", b"  working_dir: .\n  code: ./examples/tiny\n")
    result = _invoke(_drop(env["bucket"], "submissions/local-code.yaml", local))
    assert result["outcome"] == "rejected" and result["reasons"][0].startswith("entrypoint.code: is a local path")
    remote = TINY.replace(b"  working_dir: .\n", f"  working_dir: .\n  code: s3://{env['bucket']}/code/x.tar.gz\n"
                          .encode())
    assert _invoke(_drop(env["bucket"], "submissions/s3-code.yaml", remote))["outcome"] == "started"
