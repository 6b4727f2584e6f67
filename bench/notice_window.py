"""Notice-window benchmark: does the final save of a notice window commit before the reclaim?

    .venv/bin/python bench/notice_window.py [--runs 3] [--window 30]   # ~1 minute a run on 2 cores

The speed half of tests/integration/test_notice_training.py (the test checks what is
deterministic: snapshot at the notice, training on, stop, resume bit-identical). Here real torchrun
(2 gloo ranks, the tiny transformer, DDP + DCP) trains with S3 on moto's server behind the
bandwidth throttle (500 kB/s: a save of 2 x 230 kB takes seconds); after the first periodic commit
the bench writes a checkpoint_and_stop request with a deadline ``--window`` seconds ahead and, at
the deadline, reclaims the "node" (SIGKILL to the process group) as EC2 would. Per run: the step of
the notice and of the final save, how many steps were trained in the window, and the final save's
commit time against the deadline (negative: before the reclaim). Ends with the share of runs whose
final save committed before the reclaim and the mean slack left.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from spotrelay.contracts import control  # noqa: E402
from spotrelay.contracts.control import RequestKind, StopRequest  # noqa: E402
from spotrelay.local import motoserver  # noqa: E402
from spotrelay.local.throttle import Throttle  # noqa: E402

TRAIN = ROOT / "examples" / "tiny" / "train.py"
STEPS, EVERY, STEP_SLEEP = 400, 10, 0.25
THROTTLE_BYTES_S = 500_000


def one_run(work: Path, port: int, bucket: str, window_s: float) -> dict[str, float | int | bool]:
    ctl = work / "control"
    with Throttle("127.0.0.1", port, THROTTLE_BYTES_S) as throttle:
        env = {**os.environ, "PYTHONWARNINGS": "ignore", "AWS_ENDPOINT_URL_S3": throttle.url,
               control.ENV_CONTROL_DIR: str(ctl), control.ENV_CHECKPOINT_URI: f"s3://{bucket}/ckpt/{work.name}",
               control.ENV_JOB_ID: work.name}  # fmt: skip
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(TRAIN),
               "--checkpoint-dir", str(work / "node"), "--out", str(work / "out"), "--engine", "ddp",
               "--steps", str(STEPS), "--every", str(EVERY), "--step-sleep", str(STEP_SLEEP)]  # fmt: skip
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)  # fmt: skip
        try:
            while proc.poll() is None and not any(e.kind == "checkpoint_committed" for e in _events(ctl)):
                time.sleep(0.05)
            deadline = time.time() + window_s
            control.write_request(ctl, StopRequest(request_id="notice", kind=RequestKind.CHECKPOINT_AND_STOP,
                                                   deadline=deadline))  # fmt: skip
            while proc.poll() is None and time.time() < deadline:
                time.sleep(0.05)
            reclaimed = proc.poll() is None
            if reclaimed:  # the instance is taken: whatever is not committed now is lost
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    events = _events(ctl)
    notice = next((e for e in events if e.kind == "notice_training"), None)
    emergency = [e for e in events if e.kind == "checkpoint_committed" and e.emergency]
    stopping = next((e for e in events if e.kind == "stopping"), None)
    final = emergency[-1] if emergency else None
    in_time = final is not None and final.time <= deadline and stopping is not None and final.step == stopping.step
    return {
        "notice_step": notice.step if notice else -1,
        "final_step": final.step if final else -1,
        "steps_in_window": (stopping.step - notice.step) if notice and stopping else 0,
        "commit_vs_deadline_s": (final.time - deadline) if final else float("nan"),
        "in_time": in_time,
        "reclaimed": reclaimed,
    }


def _events(ctl: Path) -> list[control.TrainerEvent]:
    return control.read_events(ctl)[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--window", type=float, default=30.0, help="seconds from the notice to the reclaim")
    args = ap.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's request log
    moto = motoserver.start()
    import boto3

    bucket = "bench-notice"
    boto3.client("s3").create_bucket(Bucket=bucket)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            row = one_run(Path(tmp) / f"run{i}", moto.port, bucket, args.window)
            rows.append(row)
            print(f"run {i + 1}: notice at step {row['notice_step']}, final save at step {row['final_step']} "
                  f"({row['steps_in_window']} steps trained in the window), committed "
                  f"{row['commit_vs_deadline_s']:+.1f} s vs the deadline, reclaimed={row['reclaimed']}",
                  flush=True)  # fmt: skip
    moto.stop()
    slack = [-float(r["commit_vs_deadline_s"]) for r in rows if r["in_time"]]
    mean = statistics.mean(slack) if slack else float("nan")
    print(f"final save committed before the reclaim: {sum(bool(r['in_time']) for r in rows)}/{len(rows)} runs; "
          f"mean slack {mean:.1f} s of a {args.window:.0f} s window")  # fmt: skip


if __name__ == "__main__":
    main()
