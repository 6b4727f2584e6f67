"""Training through a spot notice, with S3 slowed down: real torchrun (2 gloo ranks, the tiny
transformer, DDP + DCP), S3 on moto's server behind the bandwidth throttle.

The test plays the agent. Once the first periodic save has committed, it writes a
checkpoint_and_stop request whose deadline is far away (no save could need that long), so the
ranks snapshot at the notice and train on. Once they have trained past the notice step, a second
notice tightens the deadline (the earliest wins): the ranks take their final save, exit
PREEMPTED_SAVED and a fresh node (empty local tier) resumes from S3 from the newest committed step
and ends bit-identical to a straight run.

Nothing here depends on the machine's speed: every wait is for a condition, and whether the final
save beat its deadline is not asserted (the unit tests check how the save is planned; a save
committed late falls back to the notice snapshot, which the resume then uses).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spotrelay.contracts import control
from spotrelay.contracts.control import RequestKind, StopRequest
from spotrelay.contracts.exit_codes import ExitCode
from spotrelay.local.throttle import Throttle
from tests.conftest import ROOT
from tests.integration.torchrun import result, torchrun

pytestmark = pytest.mark.slow
TRAIN = ROOT / "examples" / "tiny" / "train.py"
STEPS, EVERY = 200, 10
FAR_S = 3600.0  # the first notice's window: training on is never in doubt
TIGHT_S = 6.0  # the second notice's: the final save is due within a few steps
ARGS = ["--engine", "ddp", "--steps", str(STEPS), "--every", str(EVERY)]
THROTTLE_BYTES_S = 500_000  # a save of the tiny model (2 x 230 kB) takes seconds to reach S3
HANG_S = 300.0  # every wait's bound: it only catches a hang


def _events(control_dir: Path) -> list[control.TrainerEvent]:
    return control.read_events(control_dir)[0]


def _wait(cond: object, what: str) -> None:
    give_up = time.time() + HANG_S
    while time.time() < give_up:
        if cond():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _notice(control_dir: Path, request_id: str, window_s: float) -> float:
    deadline = time.time() + window_s
    control.write_request(control_dir, StopRequest(request_id=request_id, kind=RequestKind.CHECKPOINT_AND_STOP,
                                                   deadline=deadline))  # fmt: skip
    return deadline


def test_training_on_through_a_notice_then_stopping_at_a_tighter_one_resumes_bit_identical(
    aws: dict[str, str], tmp_path: Path
) -> None:
    uri = f"s3://{aws['bucket']}/checkpoints/job-notice"
    ctl = tmp_path / "control-a"
    torchrun(TRAIN, tmp_path, "straight", tmp_path / "ckpt-straight", ARGS)
    port = int(os.environ["AWS_ENDPOINT_URL"].rsplit(":", 1)[1])
    with Throttle("127.0.0.1", port, THROTTLE_BYTES_S) as throttle:
        env = {
            **os.environ, "PYTHONWARNINGS": "ignore", "AWS_ENDPOINT_URL_S3": throttle.url,
            control.ENV_CONTROL_DIR: str(ctl), control.ENV_CHECKPOINT_URI: uri, control.ENV_JOB_ID: "job-notice",
        }  # fmt: skip
        out = tmp_path / "noticed"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(TRAIN)]
        cmd += ["--checkpoint-dir", str(tmp_path / "node-a"), "--out", str(out), *ARGS, "--step-sleep", "0.25"]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        try:
            _wait(
                lambda: (
                    proc.poll() is not None
                    or any(e.kind == "checkpoint_committed" and e.step == EVERY for e in _events(ctl))
                ),
                "a periodic save",
            )
            _notice(ctl, "notice-1", FAR_S)
            _wait(
                lambda: proc.poll() is not None or any(e.kind == "notice_training" for e in _events(ctl)),
                "training on after the notice",
            )
            seen = [e for e in _events(ctl) if e.kind == "notice_training"]
            _wait(
                lambda: proc.poll() is not None or not seen or (control.read_progress(ctl) or 0) >= seen[0].step + 2,
                "two steps past the notice",
            )
            tight = _notice(ctl, "notice-2", TIGHT_S)
            stderr = proc.communicate(timeout=HANG_S)[1].decode(errors="replace")
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
        uploaded = throttle.bytes_up
        # the replacement node: an empty local tier, everything from S3 (through the same slow link)
        env[control.ENV_CONTROL_DIR] = str(tmp_path / "control-b")
        torchrun(TRAIN, tmp_path, "resumed", tmp_path / "node-b", ARGS, env=env)

    events = _events(ctl)
    kinds = [e.kind for e in events]
    notice = next((e for e in events if e.kind == "notice_training"), None)
    assert notice is not None, f"no training on after a notice {FAR_S:.0f} s ahead: {kinds}\n{stderr[-3000:]}"
    emergency = [e for e in events if e.kind == "checkpoint_committed" and e.emergency]
    stopping = next(e for e in events if e.kind == "stopping")
    # a snapshot at the notice, then training on (no periodic saves in the window), then a stop at the
    # tighter deadline, whose final save (when it committed) carries that deadline
    assert notice.step >= EVERY and emergency[0].step == notice.step, kinds
    assert stopping.step >= notice.step + 2, kinds
    assert not [e for e in events if e.kind == "checkpoint_committed" and not e.emergency and e.step > notice.step]
    assert [e.step for e in emergency] in ([notice.step], [notice.step, stopping.step]), kinds
    assert emergency[-1].step == notice.step or emergency[-1].deadline == pytest.approx(tight, abs=0.01)
    newest = emergency[-1].step
    assert uploaded > 0  # the checkpoints went through the throttle

    for rank in (0, 1):
        noticed = result(tmp_path, "noticed", rank)
        resumed, straight = result(tmp_path, "resumed", rank), result(tmp_path, "straight", rank)
        assert noticed["exit"] == ExitCode.PREEMPTED_SAVED, stderr[-3000:]
        lines = Path(f"{out}.rank{rank}.steps.jsonl").read_text().splitlines()
        trained = [json.loads(line) for line in lines]
        assert [s for s, _ in trained] == list(range(stopping.step))  # trained on through the window
        assert resumed["resumed_from"] == newest and resumed["exit"] == ExitCode.DONE
        assert trained[:newest] + resumed["losses"] == straight["losses"]  # floats compared exactly
        assert resumed["state_sha256"] == straight["state_sha256"]
