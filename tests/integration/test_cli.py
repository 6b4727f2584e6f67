"""The CLI against moto's server: validate, schema, submit (drops into S3), jobs, status, cancel."""

from __future__ import annotations

import json
import os

import pytest
from rich.console import Console
from typer.testing import CliRunner

from spotrelay.adapters.aws import client
from spotrelay.adapters.dynamodb_job_store import DynamoDBJobStore
from spotrelay.cli import main as cli_main
from spotrelay.cli.main import app
from spotrelay.domain.models import Job
from spotrelay.domain.status import JobStatus
from tests.conftest import ROOT

runner = CliRunner()
TINY = str(ROOT / "examples" / "tiny.yaml")


def test_validate_good_and_bad(tmp_path: object) -> None:
    good = runner.invoke(app, ["validate", TINY])
    assert good.exit_code == 0, good.output
    bad_file = os.path.join(str(tmp_path), "bad.yaml")
    with open(bad_file, "w") as fh:
        fh.write("version: 1\nname: x\nentrypoint: {script: a.py}\nresources: {nodes: -1}\n"
                 "checkpoint: {every_minutes: never}\n")
    bad = runner.invoke(app, ["validate", bad_file])
    assert bad.exit_code == 2
    assert "resources.nodes" in bad.output and "checkpoint.every_minutes: minutes above 0, or 'auto'" in bad.output


def test_schema_is_json_schema() -> None:
    result = runner.invoke(app, ["schema"])
    schema = json.loads(result.stdout)
    assert schema["title"] == "JobSpec" and "resources" in schema["properties"]


def test_submit_uploads_and_prints_job_id(aws: dict[str, str]) -> None:
    result = runner.invoke(app, ["submit", TINY, "--endpoint-url", os.environ["AWS_ENDPOINT_URL"]])
    assert result.exit_code == 0, result.output
    job_id = result.stdout.strip().splitlines()[-1]
    keys = [o["Key"] for o in client("s3").list_objects_v2(Bucket=aws["bucket"])["Contents"]]
    assert len(keys) == 1 and keys[0].startswith("submissions/tiny-demo-")
    etag = client("s3").head_object(Bucket=aws["bucket"], Key=keys[0])["ETag"]
    from spotrelay.domain.models import job_id_for

    assert job_id == job_id_for(keys[0], etag)


def test_submit_refuses_bad_spec_without_uploading(aws: dict[str, str], tmp_path: object) -> None:
    bad_file = os.path.join(str(tmp_path), "bad.yaml")
    with open(bad_file, "w") as fh:
        fh.write("version: 1\n")
    result = runner.invoke(app, ["submit", bad_file])
    assert result.exit_code == 2
    assert "Contents" not in client("s3").list_objects_v2(Bucket=aws["bucket"])


def test_jobs_status_and_cancel(aws: dict[str, str]) -> None:
    store = DynamoDBJobStore()
    store.create_job(Job(job_id="j-running", name="llm", status=JobStatus.SUBMITTED, created_at=1, updated_at=1))
    listed = runner.invoke(app, ["jobs"])
    assert listed.exit_code == 0 and "j-running" in listed.output
    as_json = runner.invoke(app, ["jobs", "--json"])
    assert [j["job_id"] for j in json.loads(as_json.stdout)] == ["j-running"]
    shown = runner.invoke(app, ["status", "j-running", "--json"])
    assert json.loads(shown.stdout)["job"]["status"] == "SUBMITTED"
    cancelled = runner.invoke(app, ["cancel", "j-running"])
    assert cancelled.exit_code == 0, cancelled.output
    assert store.get_job("j-running").status is JobStatus.CANCELLED
    again = runner.invoke(app, ["cancel", "j-running"])
    assert again.exit_code == 1 and "already ended" in again.output
    missing = runner.invoke(app, ["status", "nope"])
    assert missing.exit_code == 1


def test_submit_names_every_upload_uniquely_and_accepts_any_case_suffix(aws: dict[str, str], tmp_path: object) -> None:
    upper = os.path.join(str(tmp_path), "TINY.YAML")
    with open(TINY, "rb") as src, open(upper, "wb") as dst:
        dst.write(src.read())
    ids = [runner.invoke(app, ["submit", path]).stdout.strip().splitlines()[-1] for path in (TINY, TINY, upper)]
    assert len(set(ids)) == 3  # same file, same second: three jobs
    keys = [o["Key"] for o in client("s3").list_objects_v2(Bucket=aws["bucket"])["Contents"]]
    from spotrelay.services.submit import is_submission
    from spotrelay.spec.load import suffix_problem

    assert len(keys) == 3 and all(is_submission(k) and suffix_problem(k) is None and k.endswith(".yaml") for k in keys)


def test_jobs_prints_ids_whole_and_json(aws: dict[str, str]) -> None:
    store = DynamoDBJobStore()
    long_id = "a-rather-long-job-name-20261201t031100-abcdef12-0123456789ab"
    store.create_job(Job(job_id=long_id, name="llm", status=JobStatus.SUBMITTED, created_at=1, updated_at=1))
    narrow = CliRunner(env={"COLUMNS": "60"}).invoke(app, ["jobs"])
    assert narrow.exit_code == 0 and long_id in narrow.output, narrow.output
    listed = json.loads(runner.invoke(app, ["jobs", "--json"]).stdout)
    assert [j["job_id"] for j in listed] == [long_id] and listed[0]["status"] == "SUBMITTED"


def test_status_shows_the_attempts(aws: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    from spotrelay.domain.models import Attempt, Pool

    pool = Pool(region="us-east-1", az="us-east-1a", instance_type="p5.48xlarge", market="spot")
    attempts = [Attempt(number=1, pool=pool, started_at=100, ended_at=200, end_reason="interrupted", nodes=2),
                Attempt(number=2, pool=pool, started_at=300, resumed_from_step=40, nodes=2)]
    DynamoDBJobStore().create_job(Job(job_id="j-att", name="llm", status=JobStatus.RUNNING, attempt=2,
                                      attempts=attempts, created_at=1, updated_at=1))
    # the module's console took its width when first imported (COLUMNS then: 60 when the narrow jobs
    # test ran first under xdist), and the attempts table then dropped its columns' contents
    monkeypatch.setattr(cli_main, "out", Console(width=200))
    shown = CliRunner().invoke(app, ["status", "j-att"])
    assert shown.exit_code == 0, shown.output
    assert "interrupted" in shown.output and "step 40" in shown.output and pool.key in shown.output


def test_jobs_by_status_and_limit(aws: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """``--status`` reads those statuses through the by-status index (the scan is never called), groups
    ``active``/``ended`` take every status not ended / ended; ``--limit`` keeps the newest by submission."""
    store = DynamoDBJobStore()
    kinds = [("j-old-ok", JobStatus.SUCCEEDED), ("j-run-1", JobStatus.RUNNING), ("j-failed", JobStatus.FAILED),
             ("j-sub", JobStatus.SUBMITTED), ("j-run-2", JobStatus.RUNNING), ("j-cancelling", JobStatus.CANCELLING)]
    for n, (job_id, status) in enumerate(kinds):
        store.create_job(Job(job_id=job_id, name="llm", status=status, created_at=100 + n, updated_at=100 + n))

    def listed(*args: str) -> list[str]:
        result = runner.invoke(app, ["jobs", "--json", *args])
        assert result.exit_code == 0, result.output
        return [j["job_id"] for j in json.loads(result.stdout)]

    assert listed() == [job_id for job_id, _ in kinds]
    assert listed("--limit", "2") == ["j-run-2", "j-cancelling"]

    def no_scan(self: DynamoDBJobStore) -> list[Job]:
        raise AssertionError("a status selection scanned the whole table")

    monkeypatch.setattr(DynamoDBJobStore, "all_jobs", no_scan)
    assert listed("--status", "running") == ["j-run-1", "j-run-2"]
    assert listed("--status", "RUNNING,failed") == ["j-run-1", "j-failed", "j-run-2"]  # oldest first, one list
    assert listed("--status", "active") == ["j-run-1", "j-sub", "j-run-2", "j-cancelling"]
    assert listed("--status", "ended,ended") == ["j-old-ok", "j-failed"]
    assert listed("--status", "active", "--limit", "1") == ["j-cancelling"]
    assert listed("--status", "rejected") == []
    table = runner.invoke(app, ["jobs", "--status", "running", "--limit", "1"])
    assert table.exit_code == 0 and "j-run-2" in table.output and "j-run-1" not in table.output
    assert "and 1 earlier jobs (--limit 1)" in table.output


@pytest.mark.parametrize(("args", "named"), [
    (["--status", "runing"], "--status: 'runing' is not a job status; it takes active, ended or submitted"),
    (["--status", " , "], "--status: names no status"),
    (["--limit", "0"], "--limit"),
    (["--limit", "many"], "--limit"),
])
def test_jobs_refuses_a_bad_selection_in_one_line(aws: dict[str, str], args: list[str], named: str) -> None:
    DynamoDBJobStore().create_job(Job(job_id="j-1", name="llm", status=JobStatus.RUNNING, created_at=1, updated_at=1))
    result = runner.invoke(app, ["jobs", *args])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and named in lines[0], result.output
