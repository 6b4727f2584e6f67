"""Resume at another world size: DDP, FSDP2, DeepSpeed ZeRO-2 and ZeRO-3, 2 -> 1 -> 3 gloo ranks.

One straight run on 2 ranks (global batch 12, micro-batch 2, 48 samples: 4 steps an epoch, 10
steps) saves every 3 steps. Its step-3 checkpoint is copied to a fresh folder, resumed on 1 rank
to step 6 (accumulating 6 micro-batches), then on 3 ranks to step 10 (2 micro-batches), with no
batch flag: the global batch comes back from the checkpoint. Every step's global mean loss
matches the straight run within 1e-4 (relative), every step uses the same 12 samples, and every
epoch uses each of the 48 samples exactly once. Dropout is off: its masks depend on how many
ranks draw them. The DDP run's step-3 checkpoint also resumes under FSDP2 on 3 ranks.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.integration.torchrun import result, torchrun

pytestmark = pytest.mark.slow
TRAIN, SHARDED = ROOT / "examples" / "tiny" / "train.py", ROOT / "tests" / "integration" / "sharded_train.py"
ENGINES = {"ddp": (TRAIN, "ddp"), "fsdp": (SHARDED, "fsdp"), "zero2": (TRAIN, "deepspeed"), "zero3": (SHARDED, "zero3")}
COMMON = ["--samples", "48", "--batch", "2", "--dropout", "0"]
SAMPLES, GLOBAL, STEPS = 48, 12, 10
RESUMES = ((1, 6), (3, 10))  # (ranks, run until step), from the straight run's step-3 checkpoint


PHASES = [(f"resume{i}", ranks) for i, (ranks, _) in enumerate(RESUMES)]


@pytest.mark.parametrize("engine", list(ENGINES))
def test_resume_on_2_then_1_then_3_ranks_keeps_losses_and_data_order(tmp_path: Path, engine: str) -> None:
    script, kind = ENGINES[engine]
    args = ["--engine", kind, *COMMON]
    env = {"SPOTRELAY_KEEP_LOCAL": "10"}
    straight_args = [*args, "--global-batch", str(GLOBAL), "--steps", str(STEPS), "--every", "3"]
    torchrun(script, tmp_path, "straight", tmp_path / "straight", straight_args, env=env, timeout=600)
    ckpt = tmp_path / "ckpt"
    shutil.copytree(tmp_path / "straight" / "step-00000003", ckpt / "step-00000003")
    for name, (ranks, until) in zip([n for n, _ in PHASES], RESUMES, strict=True):
        torchrun(script, tmp_path, name, ckpt, [*args, "--steps", str(until)], nproc=ranks, env=env, timeout=600)

    straight = result(tmp_path, "straight", 0)
    losses: dict[int, list[float]] = {s: [] for s, _ in straight["losses"] if s < 3}
    used: dict[int, list[int]] = {s: [] for s in range(STEPS)}
    for rank in (0, 1):  # steps 0-2 ran on 2 ranks in the straight run itself
        for step, index in result(tmp_path, "straight", rank)["samples"]:
            if step < 3:
                used[step] += index
    for name, ranks in PHASES:
        for rank in range(ranks):
            got = result(tmp_path, name, rank)
            for step, loss in got["losses"]:
                losses.setdefault(step, []).append(loss)
            for step, index in got["samples"]:
                used[step] += index
    assert [result(tmp_path, n, 0)["resumed_from"] for n, _ in PHASES] == [3, 6]
    for step, loss in straight["losses"]:
        if step >= 3:
            assert losses[step], f"step {step} never ran after the resumes"
            assert all(abs(mine - loss) <= 1e-4 * abs(loss) for mine in losses[step]), (step, loss, losses[step])
    straight_used = {s: sorted(i) for s, i in straight["samples"]}
    for step in range(STEPS):
        assert len(used[step]) == GLOBAL and len(set(used[step])) == GLOBAL, step
        if step < 3:
            continue
        # the same global order as the straight run (rank 0 of the straight run saw half of each step)
        assert set(straight_used[step]) <= set(used[step]), step
    for epoch in range(STEPS * GLOBAL // SAMPLES):
        seen = sorted(i for s in range(epoch * 4, epoch * 4 + 4) for i in used[s])
        assert seen == list(range(SAMPLES)), f"epoch {epoch} did not use every sample exactly once"
    for step, world in ((6, 1), (10, 3)):
        manifest = json.loads((ckpt / f"step-{step:08d}" / "manifest.json").read_text())
        assert manifest["world_size"] == world and manifest["data_state"]["global_batch"] == GLOBAL
        assert manifest["samples"] == step * GLOBAL  # all ranks together, whatever the worlds were
    if engine == "ddp":  # DDP and FSDP2 share one DCP format and the parameter names: FSDP2 on 3 ranks
        _resumes_as_fsdp2_on_3(tmp_path, env)


def _resumes_as_fsdp2_on_3(tmp: Path, env: dict[str, str]) -> None:
    """The DDP run's step-3 checkpoint resumed by FSDP2 on 3 ranks (plain tensors resharded into
    DTensor shards, model and optimizer) to step 5: the straight DDP run's losses and samples."""
    shutil.copytree(tmp / "straight" / "step-00000003", tmp / "cross" / "step-00000003")
    torchrun(SHARDED, tmp, "fsdp", tmp / "cross", ["--engine", "fsdp", *COMMON, "--steps", "5"], nproc=3, env=env,
             timeout=600)  # fmt: skip
    ref = dict(result(tmp, "straight", 0)["losses"])
    got = result(tmp, "fsdp", 0)
    assert got["resumed_from"] == 3 and [s for s, _ in got["losses"]] == [3, 4]
    assert all(abs(loss - ref[step]) <= 1e-4 * abs(ref[step]) for step, loss in got["losses"]), (got["losses"], ref)
    for step in (3, 4):
        used = sorted(i for r in range(3) for s, idx in result(tmp, "fsdp", r)["samples"] if s == step for i in idx)
        want = sorted(i for r in range(2) for s, idx in result(tmp, "straight", r)["samples"] if s == step for i in idx)
        assert used == want and len(used) == GLOBAL, step


def test_zero1_on_2_ranks_resumes_as_zero3_on_3(tmp_path: Path) -> None:
    """The ZeRO stage and the world size change at once: a ZeRO-1 checkpoint of 2 ranks, resumed by a
    ZeRO-3 engine on 3 (merge by the saved stage, scatter by the live one); the losses and samples of
    the straight ZeRO-1 run's steps 3-5."""
    env = {"SPOTRELAY_KEEP_LOCAL": "10"}
    straight = ["--engine", "deepspeed", "--zero-stage", "1", *COMMON, "--global-batch", str(GLOBAL), "--steps", "6",
                "--every", "3"]  # fmt: skip
    torchrun(TRAIN, tmp_path, "straight", tmp_path / "straight", straight, env=env, timeout=600)
    ckpt = tmp_path / "ckpt"
    shutil.copytree(tmp_path / "straight" / "step-00000003", ckpt / "step-00000003")
    torchrun(SHARDED, tmp_path, "zero3", ckpt, ["--engine", "zero3", *COMMON, "--steps", "6"], nproc=3, env=env,
             timeout=600)  # fmt: skip
    ref = dict(result(tmp_path, "straight", 0)["losses"])
    got = result(tmp_path, "zero3", 0)
    assert got["resumed_from"] == 3 and [s for s, _ in got["losses"]] == [3, 4, 5]
    assert all(abs(loss - ref[step]) <= 1e-4 * abs(ref[step]) for step, loss in got["losses"]), (got["losses"], ref)
    for step in (3, 4, 5):
        ref_used = sorted(i for r in (0, 1) for s, idx in result(tmp_path, "straight", r)["samples"] if s == step
                          for i in idx)  # fmt: skip
        used = sorted(i for r in (0, 1, 2) for s, idx in result(tmp_path, "zero3", r)["samples"] if s == step
                      for i in idx)  # fmt: skip
        assert used == ref_used and len(used) == GLOBAL, step
