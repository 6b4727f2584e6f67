"""Refusals at resume on 2 real torchrun ranks (gloo, DDP, examples/tiny): each rank prints one
line and exits before training, none waits for the others in a collective, the agent's ``refused``
event is written, and the checkpoint is left as it was.

- a ``--global-batch`` other than the checkpoint's (then the same run with the opt-in continues);
- a manifest of a newer format (rank 0 reads it; rank 1 must hear of it, not hang in the broadcast),
  never skipped for the older step next to it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from spotrelay.contracts import control
from tests.conftest import ROOT
from tests.integration.torchrun import result, torchrun

pytestmark = pytest.mark.slow
TRAIN = ROOT / "examples" / "tiny" / "train.py"
COMMON = ["--engine", "ddp", "--samples", "32", "--dropout", "0"]


def _refused(tmp: Path, name: str, ckpt: Path, args: list[str]) -> list[str]:
    """Run 2 ranks expecting a refusal; every rank's stderr, one string per rank."""
    logs = tmp / f"{name}-logs"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "--log-dir", str(logs), "--redirects", "2", str(TRAIN),
           "--checkpoint-dir", str(ckpt), "--out", str(tmp / name), *COMMON, *args]  # fmt: skip
    env = {**os.environ, "PYTHONWARNINGS": "ignore", control.ENV_CONTROL_DIR: str(tmp / f"{name}-control")}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode != 0, done.stderr[-2000:]
    assert not list(tmp.glob(f"{name}.rank*.json")), "a rank trained"
    per_rank = sorted(logs.rglob("stderr.log"), key=lambda p: p.parent.name)
    assert len(per_rank) == 2, done.stderr[-2000:]
    return [p.read_text() for p in per_rank]


def _one_line(ranks: list[str], *expected: str) -> str:
    """Rank 0's one error line (no rank prints a traceback; torchrun may stop rank 1 before it prints)."""
    for stderr in ranks:
        assert "Traceback" not in stderr, stderr[-3000:]
        assert len([line for line in stderr.splitlines() if line.startswith("error: ")]) <= 1, stderr[-3000:]
    [line] = [line for line in ranks[0].splitlines() if line.startswith("error: ")]
    assert all(e in line for e in expected), line
    return line.removeprefix("error: ")


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_refusals_stop_every_rank_with_one_line_and_change_nothing(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    torchrun(TRAIN, tmp_path, "first", ckpt, [*COMMON, "--steps", "2", "--every", "1"], timeout=300)
    before = _files(ckpt)  # global batch 8 (4 a rank), saved at steps 1 and 2

    ranks = _refused(tmp_path, "batch", ckpt, ["--steps", "4", "--global-batch", "16"])
    line = _one_line(ranks, "step-00000002: trained with global batch 8, this run asks for 16",
                     "--allow-global-batch-change")  # fmt: skip
    events, _ = control.read_events(tmp_path / "batch-control")
    assert {(e.kind, e.detail) for e in events} == {("refused", line)}  # the agent reports exit 80
    assert _files(ckpt) == before

    allowed = tmp_path / "allowed"
    shutil.copytree(ckpt, allowed)
    torchrun(TRAIN, tmp_path, "changed", allowed,
             [*COMMON, "--steps", "3", "--global-batch", "16", "--allow-global-batch-change"], timeout=300)  # fmt: skip
    assert result(tmp_path, "changed", 0)["resumed_from"] == 2
    assert json.loads((allowed / "step-00000003" / "manifest.json").read_text())["data_state"]["global_batch"] == 16

    manifest = ckpt / "step-00000002" / "manifest.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "format": 3}))
    before = _files(ckpt)
    ranks = _refused(tmp_path, "newer", ckpt, ["--steps", "4"])
    line = _one_line(ranks, "manifest format 3, newer than this spotrelay reads (formats 1, 2)", "upgrade spotrelay")
    events, _ = control.read_events(tmp_path / "newer-control")
    assert {(e.kind, e.detail) for e in events} == {("refused", line)}
    assert _files(ckpt) == before  # step 1 was not resumed (nor pruned, nor overwritten)
