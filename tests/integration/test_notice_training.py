"""Training through a spot notice, with S3 slowed down: real torchrun (2 gloo ranks, the tiny
transformer, DDP + DCP), S3 on moto's server behind the bandwidth throttle.

The test plays the agent: once the first periodic save has committed (this node has timed a
flush), it writes a checkpoint_and_stop request with a deadline WINDOW_S ahead, and at the
deadline it reclaims the "node" (SIGKILL to the whole process group) if training is still there.
The ranks must snapshot at the notice, keep training, take the final save late but in time, commit
it and exit PREEMPTED_SAVED before the reclaim; a fresh node (empty local tier) resumes from S3
and ends bit-identical to a straight run.
"""

from __future__ import annotations

import json
import os
import signal
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
STEPS, EVERY, WINDOW_S = 200, 10, 30.0
ARGS = ["--engine", "ddp", "--steps", str(STEPS), "--every", str(EVERY)]
THROTTLE_BYTES_S = 500_000  # a save of the tiny model (2 x 230 kB) takes seconds to reach S3


def _committed(control_dir: Path, step: int) -> bool:
    events, _ = control.read_events(control_dir)
    return any(e.kind == "checkpoint_committed" and e.step == step for e in events)


def _wait(cond: object, timeout: float, what: str) -> None:
    give_up = time.time() + timeout
    while time.time() < give_up:
        if cond():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_final_save_commits_before_the_reclaim_through_slow_s3_and_resumes_bit_identical(
    aws: dict[str, str], tmp_path: Path
) -> None:
    uri = f"s3://{aws['bucket']}/checkpoints/job-notice"
    torchrun(TRAIN, tmp_path, "straight", tmp_path / "ckpt-straight", ARGS)
    port = int(os.environ["AWS_ENDPOINT_URL"].rsplit(":", 1)[1])
    with Throttle("127.0.0.1", port, THROTTLE_BYTES_S) as throttle:
        env = {
            **os.environ, "PYTHONWARNINGS": "ignore", "AWS_ENDPOINT_URL_S3": throttle.url,
            control.ENV_CONTROL_DIR: str(tmp_path / "control-a"), control.ENV_CHECKPOINT_URI: uri,
            control.ENV_JOB_ID: "job-notice",
        }  # fmt: skip
        out = tmp_path / "noticed"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(TRAIN)]
        cmd += ["--checkpoint-dir", str(tmp_path / "node-a"), "--out", str(out), *ARGS, "--step-sleep", "0.25"]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        try:
            _wait(lambda: _committed(tmp_path / "control-a", EVERY) or proc.poll() is not None, 300, "a periodic save")
            deadline = time.time() + WINDOW_S
            control.write_request(
                tmp_path / "control-a",
                StopRequest(request_id="notice-1", kind=RequestKind.CHECKPOINT_AND_STOP, deadline=deadline),
            )
            while proc.poll() is None and time.time() < deadline:
                time.sleep(0.05)
            reclaimed = proc.poll() is None
            if reclaimed:  # the instance is taken: whatever is not committed now is lost
                os.killpg(proc.pid, signal.SIGKILL)
            stderr = proc.communicate(timeout=300)[1].decode(errors="replace")
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        uploaded = throttle.bytes_up
        # the replacement node: an empty local tier, everything from S3 (through the same slow link)
        env[control.ENV_CONTROL_DIR] = str(tmp_path / "control-b")
        torchrun(TRAIN, tmp_path, "resumed", tmp_path / "node-b", ARGS, env=env)

    events, _ = control.read_events(tmp_path / "control-a")
    kinds = [e.kind for e in events]
    notice = next(e for e in events if e.kind == "notice_training")
    commits = [e for e in events if e.kind == "checkpoint_committed" and e.emergency]
    stopping = next(e for e in events if e.kind == "stopping")
    final = commits[-1]
    # a snapshot at the notice, committed in the background, then the final save much later
    assert notice.step > EVERY and commits[0].step == notice.step, kinds
    assert final.step == stopping.step > notice.step + 1, kinds
    assert final.time <= deadline, f"the final save committed {final.time - deadline:.1f} s after the reclaim"
    assert final.deadline == pytest.approx(deadline, abs=0.01)
    assert uploaded > 0  # the checkpoints went through the throttle

    for rank in (0, 1):
        if not reclaimed:  # it had time to exit too (the margin covers that as well)
            assert result(tmp_path, "noticed", rank)["exit"] == ExitCode.PREEMPTED_SAVED, stderr[-3000:]
        lines = Path(f"{tmp_path / 'noticed'}.rank{rank}.steps.jsonl").read_text().splitlines()
        noticed = [json.loads(line) for line in lines]
        resumed, straight = result(tmp_path, "resumed", rank), result(tmp_path, "straight", rank)
        assert [s for s, _ in noticed] == list(range(final.step))  # trained on through the window
        assert resumed["resumed_from"] == final.step and resumed["exit"] == ExitCode.DONE
        assert noticed + resumed["losses"] == straight["losses"]  # floats compared exactly
        assert resumed["state_sha256"] == straight["state_sha256"]
