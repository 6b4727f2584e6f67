"""Resumes a reviewer would try: another world size and another engine of the same family at once.

- DeepSpeed ZeRO-2 on 3 ranks -> ZeRO-1 on 2. On 3 ranks the last ZeRO-2 partition is padded;
  DeepSpeed saves its fp32 weights without the padding and its Adam moments with it, which the
  merge once dropped ("the partitions hold 568 values").
- torch DDP on 2 ranks -> FSDP2 on 3: both go through DCP with the same parameter names, so the
  plain tensors a DDP run saved reshard into FSDP2's DTensor shards (model and optimizer).

A straight run (global batch 12, micro-batch 2, dropout off) saves at step 3; a copy of that step
resumes on the other engine and world to step 5 without a batch flag. Every step's global mean loss
within 1e-4 (relative) of the straight run's and the same 12 samples every step.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.integration.torchrun import result, torchrun

pytestmark = pytest.mark.slow
TRAIN, SHARDED = ROOT / "examples" / "tiny" / "train.py", ROOT / "tests" / "integration" / "sharded_train.py"
COMMON = ["--samples", "48", "--batch", "2", "--dropout", "0"]
GLOBAL, SAVED, STEPS = 12, 3, 5
CASES = {
    "zero2x3-zero1x2": ((TRAIN, ["--engine", "deepspeed", "--zero-stage", "2"], 3),
                        (TRAIN, ["--engine", "deepspeed", "--zero-stage", "1"], 2)),
    "ddpx2-fsdpx3": ((TRAIN, ["--engine", "ddp"], 2), (SHARDED, ["--engine", "fsdp"], 3)),
}  # fmt: skip


def _used(tmp: Path, name: str, ranks: int, step: int) -> list[int]:
    return sorted(i for r in range(ranks) for s, idx in result(tmp, name, r)["samples"] if s == step for i in idx)


@pytest.mark.parametrize("case", list(CASES))
def test_resume_on_another_engine_and_world(tmp_path: Path, case: str) -> None:
    (script, engine, ranks), (script2, engine2, ranks2) = CASES[case]
    env = {"SPOTRELAY_KEEP_LOCAL": "10"}
    straight = [*engine, *COMMON, "--global-batch", str(GLOBAL), "--steps", str(STEPS), "--every", str(SAVED)]
    torchrun(script, tmp_path, "straight", tmp_path / "straight", straight, nproc=ranks, env=env, timeout=600)
    ckpt = tmp_path / "ckpt"
    shutil.copytree(tmp_path / "straight" / f"step-{SAVED:08d}", ckpt / f"step-{SAVED:08d}")
    resumed = [*engine2, *COMMON, "--steps", str(STEPS)]
    torchrun(script2, tmp_path, "resumed", ckpt, resumed, nproc=ranks2, env=env, timeout=600)

    ref = dict(result(tmp_path, "straight", 0)["losses"])
    got = result(tmp_path, "resumed", 0)
    assert got["resumed_from"] == SAVED and [s for s, _ in got["losses"]] == list(range(SAVED, STEPS))
    assert all(abs(loss - ref[step]) <= 1e-4 * abs(ref[step]) for step, loss in got["losses"]), (got["losses"], ref)
    for step in range(SAVED, STEPS):
        used = _used(tmp_path, "resumed", ranks2, step)
        assert used == _used(tmp_path, "straight", ranks, step) and len(set(used)) == GLOBAL, step
