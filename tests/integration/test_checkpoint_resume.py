"""The acceptance test: stopped at step k and resumed in fresh processes == straight through, bit for bit.

Real torchrun, 2 CPU ranks on gloo, the tiny transformer of examples/tiny. The stop comes the way
the agent sends it (a checkpoint_and_stop request file written during step k-1 by rank 0 only);
the ranks agree on it with the all-reduce and exit PREEMPTED_SAVED after the commit.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spotrelay.contracts import control
from tests.conftest import ROOT
from tests.integration.torchrun import check_stop_and_resume, torchrun

pytestmark = pytest.mark.slow
TRAIN = ROOT / "examples" / "tiny" / "train.py"
STEPS, STOP_AT = 8, 3


def _torchrun(tmp: Path, name: str, engine: str, ckpt: Path, env: dict[str, str], *extra: str) -> None:
    torchrun(TRAIN, tmp, name, ckpt, ["--engine", engine, "--steps", str(STEPS), *extra], env=env)


def _check_bit_identical(tmp: Path, events_dir: Path) -> None:
    check_stop_and_resume(tmp, STOP_AT, ("state_sha256",), events_dir)  # parameters and optimizer state


def test_deepspeed_zero2_stop_and_resume_is_bit_identical(tmp_path: Path) -> None:
    _torchrun(tmp_path, "straight", "deepspeed", tmp_path / "ckpt-straight", {})
    _torchrun(tmp_path, "stopped", "deepspeed", tmp_path / "ckpt", {}, "--stop-at", str(STOP_AT))
    _torchrun(tmp_path, "resumed", "deepspeed", tmp_path / "ckpt", {})
    _check_bit_identical(tmp_path, tmp_path / "control")
    manifest = json.loads((tmp_path / "ckpt" / "step-00000003" / "manifest.json").read_text())
    assert manifest["engine"] == "deepspeed" and manifest["zero_stage"] == 2 and manifest["world_size"] == 2
    assert manifest["ranks"] == [0, 1]


def test_ddp_dcp_stop_then_resume_from_s3_on_a_fresh_node(aws: dict[str, str], tmp_path: Path) -> None:
    uri = f"s3://{aws['bucket']}/checkpoints/job-ddp"
    _torchrun(tmp_path, "straight", "ddp", tmp_path / "ckpt-straight", {})
    s3_env = {control.ENV_CHECKPOINT_URI: uri, control.ENV_JOB_ID: "job-ddp"}
    _torchrun(tmp_path, "stopped", "ddp", tmp_path / "node-a", s3_env, "--stop-at", str(STOP_AT))
    # the replacement node starts with an empty local tier: everything comes back from S3
    _torchrun(tmp_path, "resumed", "ddp", tmp_path / "node-b", s3_env)
    _check_bit_identical(tmp_path, tmp_path / "control")
    events, _ = control.read_events(tmp_path / "control")
    assert next(e for e in events if e.emergency).uri == f"{uri}/step-00000003"
    # each run says when its first step finished, at which world size: training is back there
    resumed = next(e for e in events if e.kind == "resumed")
    back = [e for e in events if e.kind == "first_step" and e.time >= resumed.time]
    assert back and back[0].step == STOP_AT + 1 and back[0].world_size == 2
    assert (tmp_path / "node-b" / "step-00000003" / "manifest.json").is_file()
