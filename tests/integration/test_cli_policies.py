"""The CLI's managed policies (cdk/cli_access.py), enforced: moto's server checks every call's IAM action
(and, for S3, its bucket and key) against the caller's policies while these tests run the commands as
IAM users holding the policies' documents, rendered for moto's tables and bucket. moto matches a
resource for S3 only (it asks every other service's statements for ``*``), so the users' copies name
``*`` where a statement holds no S3 ARN; tests/infrastructure/test_cli_permissions.py holds the stack's
policies to their own tables, log group and state machine.

Under ``cli-user``, every command does its work and no call is denied. Under ``cli-viewer``, the
reading commands do; submit, cancel and resume stop at their first write with one line, and nothing is
changed. A user with no policy is denied, so enforcement was on.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.client import BaseClient
from typer.testing import CliRunner

from cdk import cli_access
from spotrelay.adapters.aws import client, error_code, reset_clients
from spotrelay.adapters.cloudwatch_logs import CloudWatchTrainingLogs
from spotrelay.adapters.dynamodb_job_store import DynamoDBJobStore
from spotrelay.cli.main import app
from spotrelay.domain.models import Node, NodeState, Pool
from spotrelay.domain.status import JobStatus
from spotrelay.ports.logs import LOG_GROUP_DEFAULT
from spotrelay.resources import RESOURCES
from tests.conftest import ROOT
from tests.infrastructure.aws_calls import ACTION_NAMES
from tests.integration.test_cli_resume import _stop, _submitted
from tests.integration.test_code_delivery_s3 import _project
from tests.integration.test_on_submission import env

__all__ = ["env"]
runner = CliRunner()
TINY = str(ROOT / "examples" / "tiny.yaml")
POOL = Pool(region="us-east-1", az="us-east-1a", instance_type="p5.48xlarge", market="spot")
SHARD = "step-00000040/rank-0/model.safetensors"
DENIED = {"AccessDenied", "AccessDeniedException", "403"}  # (moto answers DynamoDB's in XML: botocore reads "403")


def _reset_auth(count: str) -> None:
    request = urllib.request.Request(f"{os.environ['AWS_ENDPOINT_URL']}/moto-api/reset-auth", data=count.encode(),
                                     headers={"Content-Type": "text/plain"}, method="POST")
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert json.loads(answer.read())["status"] == "ok"


def _for_moto(document: dict[str, Any]) -> dict[str, Any]:
    """The document as moto can check it: ``*`` for every statement without S3 ARNs (moto matches no other
    service's resources), and each IAM action also under the operation names moto checks in its place
    (``s3:ListBucket`` is asked for as ``s3:ListObjectsV2``, ``s3:GetObject`` as ``s3:HeadObject``)."""
    def resources(statement: dict[str, Any]) -> Any:
        return statement["Resource"] if all(r.startswith("arn:aws:s3:::") for r in statement["Resource"]) else "*"

    def actions(statement: dict[str, Any]) -> list[str]:
        return sorted({*statement["Action"], *(op for op, a in ACTION_NAMES.items() if a in statement["Action"])})

    return {**document, "Statement": [{**s, "Action": actions(s), "Resource": resources(s)}
                                      for s in document["Statement"]]}


def _user(name: str, policy: str | None, where: cli_access.Deployment) -> dict[str, str]:
    iam = client("iam")
    iam.create_user(UserName=name)
    if policy is not None:
        iam.put_user_policy(UserName=name, PolicyName=policy,
                            PolicyDocument=json.dumps(_for_moto(cli_access.document(policy, where))))
    key = iam.create_access_key(UserName=name)["AccessKey"]
    return {"AWS_ACCESS_KEY_ID": key["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}


def _seed(env: dict[str, str]) -> dict[str, str]:
    """Jobs for every command: one running with live ranks (cancel --save), one waiting on its workflow
    (cancel), one stopped with a checkpoint (resume), and checkpoints and training logs to read."""
    store = DynamoDBJobStore()
    bucket = env["bucket"]
    ids = {"running": _submitted(bucket, "a.yaml"), "waiting": _submitted(bucket, "b.yaml"),
           "stopped": _submitted(bucket, "c.yaml")}
    store.update_job(ids["running"], lambda j: j.model_copy(update={"status": JobStatus.RUNNING, "attempt": 1}))
    for rank in (0, 1):
        store.put_node(Node(job_id=ids["running"], node_id=f"a1-r{rank}", attempt=1, rank=rank,
                            instance_id=f"i-{rank}", pool=POOL, state=NodeState.RUNNING))
    store.update_job(ids["waiting"], lambda j: j.model_copy(update={
        "status": JobStatus.PROVISIONING, "task_tokens": {"cluster_ready": "token-of-a-wait"}}))
    _stop(ids["stopped"])
    for job in (ids["running"], ids["stopped"]):
        client("s3").put_object(Bucket=bucket, Key=f"{RESOURCES.checkpoints_prefix}{job}/step-00000040/manifest.json",
                                Body=json.dumps({"step": 40, "created": time.time(), "shards": []}).encode())
        client("s3").put_object(Bucket=bucket, Key=f"{RESOURCES.checkpoints_prefix}{job}/{SHARD}", Body=b"weights")
    client("logs").create_log_group(logGroupName=LOG_GROUP_DEFAULT)
    CloudWatchTrainingLogs(LOG_GROUP_DEFAULT).put(ids["running"], 1, 0, [(int(time.time() * 1000), "step 40")])
    return ids


@pytest.fixture
def enforced(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Any]]:
    """``run(user, *args)``: the CLI as that user with IAM enforced; (result, [(action, error code)])."""
    from spotrelay.settings import settings

    s = settings()
    where = cli_access.Deployment(partition="aws", account="123456789012", region=s.region, bucket=env["bucket"],
                                  jobs_table=s.jobs_table, nodes_table=s.nodes_table, state_machine="spotrelay-job-run")
    ids = _seed(env)
    users = {name: _user(name, None if name == "nobody" else name, where)
             for name in ("cli-user", "cli-viewer", "nobody")}
    calls: list[tuple[str, str]] = []
    original = BaseClient._make_api_call  # type: ignore[attr-defined]

    def recording(self: BaseClient, operation: str, params: dict[str, Any]) -> Any:
        action = f"{self.meta.service_model.signing_name}:{operation}"
        try:
            out = original(self, operation, params)
        except Exception as exc:
            calls.append((ACTION_NAMES.get(action, action), error_code(exc)))
            raise
        calls.append((ACTION_NAMES.get(action, action), ""))
        return out

    def run(user: str, *args: str | Callable[[], Any]) -> tuple[Any, list[tuple[str, str]]]:
        """The CLI with ``args``, or (one callable) that call, as ``user``."""
        for name, value in users[user].items():
            monkeypatch.setenv(name, value)
        monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)  # (moto's fake one would be checked too)
        reset_clients()
        calls.clear()
        _reset_auth("0")
        try:
            if len(args) == 1 and callable(args[0]):
                try:
                    return args[0](), list(calls)
                except Exception as exc:
                    return exc, list(calls)
            result = runner.invoke(app, [str(a) for a in args])
        finally:
            _reset_auth("inf")
        return result, list(calls)

    monkeypatch.setattr(BaseClient, "_make_api_call", recording)
    admin = {k: os.environ[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")}
    run.ids = ids  # type: ignore[attr-defined]
    try:
        yield run
    finally:
        _reset_auth("inf")
        for name, value in admin.items():
            monkeypatch.setenv(name, value)
        reset_clients()


def _commands(ids: dict[str, str], coded: Path) -> dict[str, list[list[str]]]:
    """Each command's runs; ``coded``: a spec with local code (packed and uploaded, then found there)."""
    running, stopped = ids["running"], ids["stopped"]
    return {
        "submit": [["submit", TINY], ["submit", str(coded)], ["submit", str(coded)]],
        "jobs": [["jobs"], ["jobs", "--status", "active"]],
        "status": [["status", running]],
        "cost": [["cost", running]],
        "describe": [["describe", running, "--json"]],
        "logs": [["logs", running, "--rank", "0"]],
        "cancel": [["cancel", running, "--save"], ["cancel", ids["waiting"]]],
        "resume": [["resume", stopped]],
    }


def _keys() -> set[str]:
    from spotrelay.settings import settings

    return {o["Key"] for o in client("s3").list_objects_v2(Bucket=settings().bucket)["Contents"]}


def test_the_user_policy_runs_every_command(enforced: Callable[..., Any], tmp_path: Path) -> None:
    ids = enforced.ids  # type: ignore[attr-defined]
    made: set[str] = set()
    for command, runs in _commands(ids, _project(tmp_path)).items():
        for args in runs:
            result, calls = enforced("cli-user", *args)
            denied = [a for a, code in calls if code in DENIED]
            assert result.exit_code == 0 and not denied, f"{args}: {denied} {result.output}"
            made |= {a for a, _ in calls}
            if command == "describe":  # (it shows no checkpoints, rather than fail, when it cannot list them)
                assert [c["step"] for c in json.loads(result.stdout)["checkpoints"]] == [40]
            if command == "logs":
                assert result.stdout.splitlines() == ["step 40"]
    # each command reached the calls its policy is for (the test exercised them, not just the reads)
    assert len([k for k in _keys() if k.startswith(RESOURCES.code_prefix)]) == 1  # the second found it there
    assert {"s3:PutObject", "s3:GetObject", "dynamodb:Scan", "dynamodb:Query", "s3:ListBucket", "logs:GetLogEvents",
            "dynamodb:PutItem", "states:SendTaskFailure"} <= made, sorted(made)
    store = DynamoDBJobStore()
    assert store.get_job(ids["running"]).stop_save_by is not None  # cancel --save asked the ranks to save
    assert store.get_job(ids["waiting"]).status is JobStatus.CANCELLING


def test_the_viewer_reads_and_changes_nothing(enforced: Callable[..., Any], tmp_path: Path) -> None:
    ids = enforced.ids  # type: ignore[attr-defined]
    store = DynamoDBJobStore()
    before = {job_id: store.get_job(job_id).version for job_id in ids.values()}
    objects = _keys()
    reads = set(cli_access.POLICIES["cli-viewer"])
    for command, runs in _commands(ids, _project(tmp_path)).items():
        for args in runs:
            result, calls = enforced("cli-viewer", *args)
            denied = [a for a, code in calls if code in DENIED]
            if command in reads:
                assert result.exit_code == 0 and not denied, f"{args}: {denied} {result.output}"
                continue
            assert result.exit_code == 1 and denied, f"{args}: {calls} {result.output}"
            line = result.output.strip()
            assert "\n" not in line and "access denied" in line and "cli-user" in line, line
    assert {job_id: store.get_job(job_id).version for job_id in ids.values()} == before
    assert _keys() == objects


@pytest.mark.parametrize("user", ["cli-user", "cli-viewer"])
def test_no_policy_reads_a_checkpoints_weights(enforced: Callable[..., Any], user: str) -> None:
    """The commands read manifests only, so neither policy can download a model."""
    from spotrelay.settings import settings

    key = f"{RESOURCES.checkpoints_prefix}{enforced.ids['running']}/{SHARD}"  # type: ignore[attr-defined]
    manifest = key.replace("rank-0/model.safetensors", "manifest.json")
    got, _ = enforced(user, lambda: client("s3").get_object(Bucket=settings().bucket, Key=manifest)["Body"].read())
    assert isinstance(got, bytes) and b'"step": 40' in got, got
    denied, calls = enforced(user, lambda: client("s3").get_object(Bucket=settings().bucket, Key=key))
    assert error_code(denied) == "AccessDenied" and calls == [("s3:GetObject", "AccessDenied")], (denied, calls)


def test_enforcement_is_on_a_user_without_a_policy_is_denied(enforced: Callable[..., Any]) -> None:
    result, calls = enforced("nobody", "jobs")
    assert result.exit_code == 1 and [(a, code in DENIED) for a, code in calls] == [("dynamodb:Scan", True)], calls
    assert "access denied calling Scan" in result.output

