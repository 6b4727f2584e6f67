"""Fully sharded state resumes bit for bit too: DeepSpeed ZeRO-3, and torch FSDP2 (fully_shard) + DCP.

Same shape as test_checkpoint_resume.py: real torchrun, 2 CPU ranks on gloo; a straight run of
STEPS steps, a run stopped by a checkpoint_and_stop request at STOP_AT, and a resume in fresh
processes. tests/integration/sharded_train.py reports the gathered full parameters' digest (the
same on both ranks) and each rank's own optimizer shard's digest, so a resume that lost or
misplaced any shard fails.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT
from tests.integration.torchrun import check_stop_and_resume, result, torchrun

pytestmark = pytest.mark.slow
TRAIN = ROOT / "tests" / "integration" / "sharded_train.py"
STEPS, STOP_AT = 8, 4


def _torchrun(tmp: Path, name: str, engine: str, ckpt: Path, *extra: str) -> None:
    torchrun(TRAIN, tmp, name, ckpt, ["--engine", engine, "--steps", str(STEPS), *extra], timeout=240)


def _stop_and_resume(tmp: Path, engine: str) -> dict[str, Any]:
    """Run straight, stopped and resumed; check bit identity; return the stop checkpoint's manifest."""
    _torchrun(tmp, "straight", engine, tmp / "ckpt-straight")
    _torchrun(tmp, "stopped", engine, tmp / "ckpt", "--stop-at", str(STOP_AT))
    _torchrun(tmp, "resumed", engine, tmp / "ckpt")
    # gathered full parameters, and this rank's optimizer shard
    check_stop_and_resume(tmp, STOP_AT, ("params_sha256", "optim_sha256"), tmp / "control")
    for rank in (0, 1):  # the digest sees training
        assert result(tmp, "stopped", rank)["params_sha256"] != result(tmp, "straight", rank)["params_sha256"]
    assert result(tmp, "straight", 0)["params_sha256"] == result(tmp, "straight", 1)["params_sha256"]
    assert result(tmp, "straight", 0)["optim_sha256"] != result(tmp, "straight", 1)["optim_sha256"]  # sharded
    manifest = json.loads((tmp / "ckpt" / f"step-{STOP_AT:08d}" / "manifest.json").read_text())
    assert manifest["world_size"] == 2 and manifest["ranks"] == [0, 1]
    return dict(manifest)


def test_deepspeed_zero3_stop_and_resume_is_bit_identical(tmp_path: Path) -> None:
    manifest = _stop_and_resume(tmp_path, "zero3")
    assert manifest["engine"] == "deepspeed" and manifest["zero_stage"] == 3
    step_dir = tmp_path / "ckpt" / f"step-{STOP_AT:08d}"
    for rank in (0, 1):  # each rank saved its own parameter and optimizer partition
        assert (step_dir / f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt").is_file()
        assert (step_dir / f"bf16_zero_pp_rank_{rank}_mp_rank_00_optim_states.pt").is_file() or (
            step_dir / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"
        ).is_file()


def test_fsdp2_dcp_stop_and_resume_is_bit_identical(tmp_path: Path) -> None:
    manifest = _stop_and_resume(tmp_path, "fsdp")
    assert manifest["engine"] == "dcp"
