"""Code delivery against moto: `spotrelay submit` packs and uploads a local code directory once
per content, the controller refuses a dropped spec that names a local path, and the agent fetches,
checks and unpacks the archive the submitted spec names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agent.code import fetch
from spotrelay.adapters.aws import client
from spotrelay.cli.main import app
from spotrelay.errors import CodeArchiveError
from spotrelay.spec import parse_spec

SPEC = """version: 1
name: coded
entrypoint: {script: train.py, working_dir: src, code: ./proj}
resources: {nodes: 1, gpus_per_node: 0}
checkpoint: {every_steps: 10}
"""


def _project(tmp_path: Path) -> Path:
    (tmp_path / "proj" / "src").mkdir(parents=True)
    (tmp_path / "proj" / "src" / "train.py").write_text("print('training')\n")
    (tmp_path / "proj" / "big.ckpt").write_bytes(b"x" * 1000)
    (tmp_path / "proj" / ".gitignore").write_text("*.ckpt\n")
    (tmp_path / "job.yaml").write_text(SPEC)
    return tmp_path / "job.yaml"


def _submitted(bucket: str) -> list[dict[str, object]]:
    keys = [o["Key"] for o in client("s3").list_objects_v2(Bucket=bucket, Prefix="submissions/")["Contents"]]
    return [json.loads(client("s3").get_object(Bucket=bucket, Key=k)["Body"].read()) for k in sorted(keys)]


def test_submit_packs_uploads_once_and_the_agent_unpacks(aws: dict[str, str], tmp_path: Path) -> None:
    spec_file = _project(tmp_path)
    for _ in range(2):
        result = CliRunner().invoke(app, ["submit", str(spec_file)])
        assert result.exit_code == 0, result.output
    archives = client("s3").list_objects_v2(Bucket=aws["bucket"], Prefix="code/")["Contents"]
    assert len(archives) == 1  # content-addressed: the second submit found it there
    specs = _submitted(aws["bucket"])
    assert len(specs) == 2 and specs[0]["entrypoint"] == specs[1]["entrypoint"]
    entry = parse_spec(json.dumps(specs[0])).entrypoint
    assert entry.code == f"s3://{aws['bucket']}/{archives[0]['Key']}" and entry.code_sha256 in archives[0]["Key"]
    assert entry.working_dir == "src" and specs[0]["name"] == "coded" and "launcher" not in specs[0]

    code_dir = fetch(entry, tmp_path / "node")
    assert (code_dir / "src" / "train.py").read_text() == "print('training')\n"
    assert not (code_dir / "big.ckpt").exists()


def test_the_agent_refuses_an_archive_that_does_not_match_its_hash(aws: dict[str, str], tmp_path: Path) -> None:
    spec_file = _project(tmp_path)
    assert CliRunner().invoke(app, ["submit", str(spec_file)]).exit_code == 0
    entry = parse_spec(json.dumps(_submitted(aws["bucket"])[0])).entrypoint
    key = (entry.code or "").split("/", 3)[3]
    client("s3").put_object(Bucket=aws["bucket"], Key=key, Body=b"not the archive")  # swapped behind our back
    with pytest.raises(CodeArchiveError, match="sha256"):
        fetch(entry, tmp_path / "node")
    missing = entry.model_copy(update={"code": f"s3://{aws['bucket']}/code/none.tar.gz", "code_sha256": None})
    with pytest.raises(CodeArchiveError, match="cannot be read"):
        fetch(missing, tmp_path / "node")


def test_a_missing_code_directory_is_a_usage_error(aws: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text(SPEC)
    result = CliRunner().invoke(app, ["submit", str(tmp_path / "job.yaml")])
    assert result.exit_code == 2 and "entrypoint.code: ./proj is not a directory" in result.output
    assert "Contents" not in client("s3").list_objects_v2(Bucket=aws["bucket"])


class _Reporter:
    def __init__(self) -> None:
        self.exits: list[tuple[int, str, str]] = []

    def training_exited(self, exit_code: int, reason: str, last_step: int | None, last_committed_step: int | None,
                        output_tail: str = "") -> bool:
        self.exits.append((exit_code, reason, output_tail))
        return True


class _Agent:
    def __init__(self) -> None:
        from agent.launcher import build_plan

        self.plan_builder = build_plan


def test_the_agent_launches_inside_the_code_or_reports_a_user_error(aws: dict[str, str], tmp_path: Path) -> None:
    from agent.code import prepare
    from agent.launcher import Rendezvous
    from spotrelay.code.pack import pack
    from spotrelay.contracts.exit_codes import ExitCode

    root = _project(tmp_path).parent / "proj"
    bundle = pack(root)
    client("s3").put_object(Bucket=aws["bucket"], Key=bundle.key, Body=bundle.data)
    spec = parse_spec(SPEC.replace("code: ./proj", f"code: s3://{aws['bucket']}/{bundle.key}"))
    agent, reporter = _Agent(), _Reporter()
    assert prepare(agent, spec, tmp_path / "node", reporter) is None and reporter.exits == []
    plan = agent.plan_builder(spec, Rendezvous(1, 0, 1, "127.0.0.1", 29500), {}, None, "python")
    assert Path(plan.cwd) == tmp_path / "node" / "code" / "src" and (Path(plan.cwd) / "train.py").is_file()

    gone = parse_spec(SPEC.replace("code: ./proj", f"code: s3://{aws['bucket']}/code/{'0' * 64}.tar.gz"))
    assert prepare(_Agent(), gone, tmp_path / "other", reporter) == ExitCode.USER_ERROR
    code, reason, tail = reporter.exits[0]
    assert code == ExitCode.USER_ERROR and "cannot be read" in reason and "cannot be read" in tail
