"""A DeepSpeed fine-tune with frozen parameters and a buffer resumes at another world size (ZeRO 0-3, and
from one ZeRO stage to another).

The straight run trains 6 steps on 2 ranks and saves every 3. Its step-3 checkpoint is resumed on 1
rank to step 6, by a process that builds the model from another seed: the frozen embedding and the
buffer (samples seen, which scales every forward) come back only from the checkpoint. Each step's
global mean loss matches the straight run within 1e-4 (relative), and the buffer ends where the
straight run's did. Before, ZeRO-2 and ZeRO-3 refused such a checkpoint at another size, and ZeRO-1
and stage 0 resumed with the frozen weights and buffers the new process happened to build.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.integration.torchrun import result, torchrun

pytestmark = pytest.mark.slow
SCRIPT = ROOT / "tests" / "integration" / "frozen_train.py"
COMMON = ["--samples", "48", "--batch", "2"]
GLOBAL, STEPS = 12, 6


def _engine(which: object) -> list[str]:
    """``ddp``, a ZeRO stage, ``<stage>-tied`` (the head's weight tied to the frozen embedding's) or
    ``<stage>-tied-trained`` (tied, and the embedding trained: nothing frozen but the buffer)."""
    if which == "ddp":
        return ["--engine", "ddp"]
    stage, *rest = str(which).split("-")
    return ["--zero-stage", stage, *(["--tie"] if rest else []), *(["--train-embedding"] if "trained" in rest else [])]


@pytest.mark.parametrize(("saved", "live"), [(0, 0), (1, 1), (3, 2), (1, 3), ("ddp", "ddp"),
                                                 ("0-tied", "1-tied"), ("2-tied", "2-tied"),
                                                 ("2-tied-trained", "3-tied-trained")])
def test_a_frozen_part_and_a_buffer_come_back_at_another_world_size(tmp_path: Path, saved: object,
                                                                    live: object) -> None:
    """(ZeRO stage saved, ZeRO stage resumed), or DDP on both sides (DCP reshards by itself)."""
    env = {"SPOTRELAY_KEEP_LOCAL": "10"}
    torchrun(SCRIPT, tmp_path, "straight", tmp_path / "straight", [*_engine(saved), *COMMON,
             "--global-batch", str(GLOBAL), "--steps", str(STEPS), "--every", "3"], env=env, timeout=600)
    ckpt = tmp_path / "ckpt"
    shutil.copytree(tmp_path / "straight" / "step-00000003", ckpt / "step-00000003")
    torchrun(SCRIPT, tmp_path, "resumed", ckpt, [*_engine(live), *COMMON, "--steps", str(STEPS),
             "--init-seed", "99"], nproc=1, env=env, timeout=600)
    straight, resumed = result(tmp_path, "straight", 0), result(tmp_path, "resumed", 0)
    assert resumed["exit"] == 0 and resumed["resumed_from"] == 3, resumed
    expected = {step: loss for step, loss in straight["losses"] if step >= 3}
    got = dict(resumed["losses"])
    assert sorted(got) == sorted(expected)
    for step, loss in expected.items():
        assert abs(got[step] - loss) <= 1e-4 * abs(loss), (step, loss, got[step])
    assert resumed["seen"] == straight["seen"]


def test_tied_weights_on_deepspeed_without_zero_resume_at_the_same_size(tmp_path: Path) -> None:
    """Stage 0 saves a tied weight under both its names, where the model's parameters name it once:
    every such checkpoint was refused as another model, at any size (7 December)."""
    args = [*_engine("0-tied"), *COMMON]
    env = {"SPOTRELAY_KEEP_LOCAL": "10"}
    torchrun(SCRIPT, tmp_path, "straight", tmp_path / "straight",
             [*args, "--global-batch", str(GLOBAL), "--steps", str(STEPS), "--every", "3"], env=env, timeout=600)
    ckpt = tmp_path / "ckpt"
    shutil.copytree(tmp_path / "straight" / "step-00000003", ckpt / "step-00000003")
    torchrun(SCRIPT, tmp_path, "resumed", ckpt, [*args, "--steps", str(STEPS)], env=env, timeout=600)
    straight, resumed = result(tmp_path, "straight", 0), result(tmp_path, "resumed", 0)
    assert resumed["resumed_from"] == 3 and resumed["losses"] == straight["losses"][3:]
