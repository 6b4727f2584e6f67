"""The agent mounts the region's FSx for Lustre where the spec's dataset.fsx says (agent/fsx.py); the
mount command runs through a recording runner (no Lustre here), /proc/mounts is a file the test writes."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.fsx import MOUNT_OPTIONS, FsxMountError, mount_dataset, mounted
from spotrelay.spec.checks import fsx_problems
from spotrelay.spec.models import JobSpec
from tests.conftest import ROOT

SOURCE = "fs-0123.fsx.us-east-1.amazonaws.com@tcp:/abcd1234"


def _spec(fsx: dict[str, Any] | None) -> JobSpec:
    doc = yaml.safe_load((ROOT / "examples" / "tiny.yaml").read_text())
    dataset = {"uri": "s3://data-b/data/corpus/", **({"fsx": fsx} if fsx is not None else {})}
    return JobSpec.model_validate({**doc, "dataset": dataset})


class Runner:
    def __init__(self, code: int = 0, stderr: str = "") -> None:
        self.calls: list[list[str]] = []
        self.code, self.stderr = code, stderr

    def __call__(self, argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        assert kwargs["timeout"] > 0  # a hung mount must end
        self.calls.append(argv)
        return subprocess.CompletedProcess(argv, self.code, "", self.stderr)


def test_a_spec_without_fsx_mounts_nothing(tmp_path: Path) -> None:
    run = Runner()
    assert mount_dataset(_spec(None), SOURCE, run) is None and mount_dataset(_spec(None), None, run) is None
    assert run.calls == []


def test_the_file_system_is_mounted_at_the_specs_path(tmp_path: Path) -> None:
    run, path = Runner(), str(tmp_path / "fsx")
    assert mount_dataset(_spec({"mount_path": path}), SOURCE, run, mounts=tmp_path / "none") == path
    assert run.calls == [["mount", "-t", "lustre", "-o", MOUNT_OPTIONS, SOURCE, path]]
    assert Path(path).is_dir()


def test_an_agent_restarted_on_the_node_finds_it_mounted(tmp_path: Path) -> None:
    path = str(tmp_path / "fsx")
    mounts = tmp_path / "mounts"
    mounts.write_text(f"sysfs /sys sysfs rw 0 0\n172.31.0.5@tcp:/abcd1234 {path} lustre rw,flock 0 0\n")
    run = Runner()
    assert mounted(path, mounts) and not mounted("/other", mounts)
    assert mount_dataset(_spec({"mount_path": path}), SOURCE, run, mounts=mounts) == path and run.calls == []


def test_no_file_system_in_the_region_or_a_failed_mount_is_named(tmp_path: Path) -> None:
    spec = _spec({"mount_path": str(tmp_path / "fsx")})
    with pytest.raises(FsxMountError, match="no FSx for Lustre file system in this node's region"):
        mount_dataset(spec, None, Runner(), mounts=tmp_path / "none")
    failing = Runner(code=19, stderr="mount.lustre: mount fs@tcp:/x at /fsx failed: No such device")
    with pytest.raises(FsxMountError, match=r"exit 19\): mount.lustre: .*No such device") as caught:
        mount_dataset(spec, SOURCE, failing, mounts=tmp_path / "none")
    assert SOURCE in str(caught.value) and str(tmp_path / "fsx") in str(caught.value)

    def hangs(argv: list[str], **kwargs: Any) -> Any:
        raise subprocess.TimeoutExpired(argv, kwargs["timeout"])

    with pytest.raises(FsxMountError, match="failed"):
        mount_dataset(spec, SOURCE, hangs, mounts=tmp_path / "none")


def test_submission_refuses_fsx_on_a_deployment_without_it() -> None:
    spec = _spec({"mount_path": "/fsx"})
    assert [f for f, _ in fsx_problems(spec, False)] == ["dataset.fsx"]
    assert fsx_problems(spec, True) == [] and fsx_problems(spec, None) == []  # None: the twin, unknown
    assert fsx_problems(_spec(None), False) == []


def test_the_agent_ends_the_attempt_as_infra_error_before_any_rank(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    """agent.main: a node told to mount and unable to reports TrainingExited (infra-error, the cause) and
    starts nothing: neither the code fetch nor the agent's serve loop runs."""
    import agent.main as main
    from agent.config import AgentConfig

    config = AgentConfig(job_id="j", attempt=1, rank=0, work_dir=tmp_path)  # no fsx_source: no FSx here
    exits: list[tuple[int, str]] = []

    class Reporter:
        def __init__(self, *args: Any) -> None: ...

        def training_exited(self, code: int, reason: str, *args: Any) -> bool:
            exits.append((code, reason))
            return True

    class Agent:
        def __init__(self, *args: Any, **kwargs: Any) -> None: ...

        def on_signal(self, *args: Any) -> None: ...

        def serve(self, *args: Any, **kwargs: Any) -> int:
            raise AssertionError("no rank may start")

    monkeypatch.setattr(main, "configure", lambda file: (config, None))
    monkeypatch.setattr(main, "agent_port", lambda c: None)
    monkeypatch.setattr(main, "Reporter", Reporter)
    monkeypatch.setattr(main, "Agent", Agent)
    monkeypatch.setattr(main, "log_sink", lambda c: None)
    monkeypatch.setattr(main, "load_job_and_spec", lambda c, p: (None, _spec({"mount_path": str(tmp_path / "f")})))
    monkeypatch.setattr(main, "prepare_code", lambda *a: pytest.fail("the code fetch ran"))
    monkeypatch.setattr(main.signal, "signal", lambda *a: None)
    from spotrelay.contracts.exit_codes import ExitCode

    assert main.run_agent(None) == ExitCode.INFRA_ERROR
    assert [c for c, _ in exits] == [ExitCode.INFRA_ERROR] and "no FSx for Lustre" in exits[0][1]


@pytest.mark.parametrize(("path", "ok"), [("/fsx", True), ("/data/corpus", True), ("/opt/data", True),
                                          ("/", False), ("/fsx/", False), ("/proc/x", False), ("/usr", False),
                                          ("/opt", False), ("/opt/spotrelay/run", False), ("/a/../etc", False),
                                          ("/lib32/x", False), ("/libx32", False), ("/library", True),
                                          ("/my data", False)])
def test_a_mount_path_is_a_plain_folder_outside_the_systems(path: str, ok: bool) -> None:
    from pydantic import ValidationError

    if ok:
        assert _spec({"mount_path": path}).dataset.fsx.mount_path == path  # type: ignore[union-attr]
    else:
        with pytest.raises(ValidationError, match="mount_path"):
            _spec({"mount_path": path})


def test_a_mount_listed_with_a_trailing_slash_is_found(tmp_path: Path) -> None:
    mounts = tmp_path / "mounts"
    mounts.write_text("172.31.0.5@tcp:/abcd1234 /fsx lustre rw,flock 0 0\n")
    assert mounted("/fsx/", mounts) and mounted("/fsx", mounts)
