"""``spotrelay demo --scenario elastic`` end to end, short: the capacity for the full 2-node gang
disappears at a spot notice, the job trains on 1 node, and grows back to 2 when capacity returns.

Everything is real (the twin as in test_twin.py); the demo's own judgement is what is checked: the
job SUCCEEDED, an attempt trained on fewer nodes and the last on all of them, every step's loss is
within 1e-4 (relative) of the uninterrupted reference at the same global batch.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from spotrelay.local.demo import DemoOptions, run_demo

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow
STEPS = 200
HOLD_AT = 150  # leaves the grown gang 50 steps to train


def test_the_job_shrinks_to_the_capacity_left_and_grows_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # no moto_server fixture: the demo starts its own twin (moto included), as `spotrelay demo` does
    data = yaml.safe_load((ROOT / "examples" / "tiny.yaml").read_text())
    data["entrypoint"]["args"] = ["--engine", "ddp",  # DDP + DCP starts faster than DeepSpeed
                                  # the 1-node gang (attempt 2) waits at step HOLD_AT until the grow-back
                                  # asks it to stop: the job cannot finish before capacity returns and the
                                  # review moves it, however slow the machine is
                                  "--hold-rank", "0", "--hold-at", f"{HOLD_AT}@2"]
    # stop at the notice (the demo trains on through the window; here the job would end inside it)
    data["entrypoint"].setdefault("env", {})["SPOTRELAY_NOTICE_TRAINING"] = "0"
    data["checkpoint"]["every_steps"] = 5
    spec = tmp_path / "tiny-elastic.yaml"
    spec.write_text(yaml.safe_dump(data))
    monkeypatch.chdir(ROOT)  # the demo delivers the job's code from the working directory
    summary = run_demo(DemoOptions(out=tmp_path / "demo", spec=spec, live=False, steps=STEPS, notice_step=8,
                                   grow_after_steps=10, step_sleep_s=0.2, timeout_s=900, s3_mb_s=None,
                                   scenario="elastic"))  # fmt: skip
    assert summary.ok, summary.problems
    assert summary.status == "SUCCEEDED"
    sizes = summary.elastic["world_sizes"]
    assert sizes[0] == 2 and 1 in sizes and sizes[-1] == 2
    assert summary.elastic["losses_compared"] >= 200 and summary.elastic["loss_max_rel_diff"] <= 1e-4
