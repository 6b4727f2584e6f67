"""Resumes a reviewer would try: another world size and another ZeRO stage at once, another model.

- DeepSpeed ZeRO-2 on 3 ranks -> ZeRO-1 on 2. On 3 ranks the last ZeRO-2 partition is padded;
  DeepSpeed saves its fp32 weights without the padding and its Adam moments with it, which the
  merge once dropped ("the partitions hold 568 values"). The same checkpoint given to a wider
  model on 1 rank is refused before anything loads, naming it, and left as it was.
(DDP on 2 ranks -> FSDP2 on 3 is in test_checkpoint_resume_elastic.py, from its DDP run.)

A straight run (global batch 12, micro-batch 2, dropout off) saves at step 3; a copy of that step
resumes on the other stage and world to step 5 without a batch flag. Every step's global mean loss
within 1e-4 (relative) of the straight run's and the same 12 samples every step.
"""

from __future__ import annotations

import hashlib
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
COMMON = ["--samples", "48", "--batch", "2", "--dropout", "0"]
GLOBAL, SAVED, STEPS = 12, 3, 5
ENV = {"SPOTRELAY_KEEP_LOCAL": "10"}
ZERO2 = ["--engine", "deepspeed", "--zero-stage", "2"]


def _copy_of_step_3(tmp: Path, name: str) -> Path:
    shutil.copytree(tmp / "straight" / f"step-{SAVED:08d}", tmp / name / f"step-{SAVED:08d}")
    return tmp / name


def _used(tmp: Path, name: str, ranks: int, step: int) -> list[int]:
    return sorted(i for r in range(ranks) for s, idx in result(tmp, name, r)["samples"] if s == step for i in idx)


@pytest.fixture(scope="module")
def zero2_on_3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The straight ZeRO-2 run on 3 ranks to step 5, saving at step 3."""
    tmp = tmp_path_factory.mktemp("zero2x3")
    args = [*ZERO2, *COMMON, "--global-batch", str(GLOBAL), "--steps", str(STEPS), "--every", str(SAVED)]
    torchrun(TRAIN, tmp, "straight", tmp / "straight", args, nproc=3, env=ENV, timeout=600)
    return tmp


def test_zero2_on_3_ranks_resumes_as_zero1_on_2(zero2_on_3: Path) -> None:
    tmp, ckpt = zero2_on_3, _copy_of_step_3(zero2_on_3, "ckpt")
    args = ["--engine", "deepspeed", "--zero-stage", "1", *COMMON, "--steps", str(STEPS)]
    torchrun(TRAIN, tmp, "resumed", ckpt, args, nproc=2, env=ENV, timeout=600)
    ref = dict(result(tmp, "straight", 0)["losses"])
    got = result(tmp, "resumed", 0)
    assert got["resumed_from"] == SAVED and [s for s, _ in got["losses"]] == list(range(SAVED, STEPS))
    assert all(abs(loss - ref[step]) <= 1e-4 * abs(ref[step]) for step, loss in got["losses"]), (got["losses"], ref)
    for step in range(SAVED, STEPS):
        used = _used(tmp, "resumed", 2, step)
        assert used == _used(tmp, "straight", 3, step) and len(set(used)) == GLOBAL, step


def _digest(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(folder)).encode() + path.read_bytes())
    return digest.hexdigest()


def test_another_model_is_refused_by_deepspeed_at_another_world(zero2_on_3: Path) -> None:
    ckpt = _copy_of_step_3(zero2_on_3, "wider")
    before = _digest(ckpt)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1", str(TRAIN),
           "--checkpoint-dir", str(ckpt), *ZERO2, *COMMON, "--d-model", "48", "--steps", str(STEPS)]  # fmt: skip
    events = zero2_on_3 / "wider-control"
    env = {**os.environ, "PYTHONWARNINGS": "ignore", control.ENV_CONTROL_DIR: str(events), **ENV}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode != 0
    line = f"error: {ckpt / f'step-{SAVED:08d}'}: another model: shapes differ: body.layers.0.linear1.bias saved (128,)"
    assert line in done.stderr, done.stderr[-3000:]
    assert _digest(ckpt) == before and sorted(p.name for p in ckpt.iterdir()) == [f"step-{SAVED:08d}"]
    refused = [e for e in control.read_events(events)[0] if e.kind == "refused"]
    assert refused and "another model" in (refused[0].detail or "")


def test_zero0_on_2_ranks_resumes_on_1(tmp_path: Path) -> None:
    """DeepSpeed without ZeRO saves no parameter list and no partitions (its torch optimizer's state
    is in the model states file): the resume used to fail on any world ('NoneType' object is not
    iterable), and at another size there was nothing to merge."""
    zero0 = ["--engine", "deepspeed", "--zero-stage", "0"]
    args = [*zero0, *COMMON, "--global-batch", str(GLOBAL), "--steps", str(STEPS), "--every", str(SAVED)]
    torchrun(TRAIN, tmp_path, "straight", tmp_path / "straight", args, nproc=2, env=ENV, timeout=600)
    ckpt = _copy_of_step_3(tmp_path, "ckpt")
    torchrun(TRAIN, tmp_path, "resumed", ckpt, [*zero0, *COMMON, "--steps", str(STEPS)], nproc=1, env=ENV, timeout=600)
    ref = dict(result(tmp_path, "straight", 0)["losses"])
    got = result(tmp_path, "resumed", 0)
    assert got["resumed_from"] == SAVED and [s for s, _ in got["losses"]] == list(range(SAVED, STEPS))
    assert all(abs(loss - ref[step]) <= 1e-4 * abs(ref[step]) for step, loss in got["losses"]), (got["losses"], ref)
    for step in range(SAVED, STEPS):
        assert _used(tmp_path, "resumed", 1, step) == _used(tmp_path, "straight", 2, step), step
