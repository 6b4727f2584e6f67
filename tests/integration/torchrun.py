"""Running a training script under real torchrun (2 CPU ranks, gloo) and reading what each rank wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from spotrelay.contracts import control
from spotrelay.contracts.exit_codes import ExitCode


def torchrun(
    script: Path,
    tmp: Path,
    name: str,
    ckpt: Path,
    args: list[str],
    env: dict[str, str] | None = None,
    timeout: int = 400,
    nproc: int = 2,
) -> None:
    """``script --checkpoint-dir ckpt --out tmp/name *args``; fails the test if a rank wrote nothing."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc), str(script)]
    cmd += ["--checkpoint-dir", str(ckpt), "--out", str(tmp / name), *args]
    full_env = {
        **os.environ, "PYTHONWARNINGS": "ignore", control.ENV_CONTROL_DIR: str(tmp / "control"),
        control.ENV_NOTICE_TRAINING: "0",  # --stop-at: stop at the request (training on: test_notice_training)
        **(env or {}),
    }  # fmt: skip
    done = subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=timeout, check=False)
    if not all((tmp / f"{name}.rank{r}.json").exists() for r in range(nproc)):
        pytest.fail(f"{name} wrote no result (rc {done.returncode}):\n{done.stderr[-4000:]}")


def result(tmp: Path, name: str, rank: int) -> dict[str, Any]:
    return dict(json.loads((tmp / f"{name}.rank{rank}.json").read_text()))


def check_stop_and_resume(tmp: Path, stop_at: int, digests: tuple[str, ...], events_dir: Path) -> None:
    """Runs ``straight``, ``stopped`` (checkpoint_and_stop during step k-1) and ``resumed``: per rank,
    stopped + resumed losses are the straight run's exactly and so are the ``digests``; the control
    events show one emergency commit at k for rank 0's request, then stopping, then resumed."""
    for rank in (0, 1):
        straight, stopped, resumed = (result(tmp, n, rank) for n in ("straight", "stopped", "resumed"))
        assert [s for s, _ in stopped["losses"]] == list(range(stop_at))
        assert stopped["exit"] == ExitCode.PREEMPTED_SAVED
        assert resumed["resumed_from"] == stop_at and resumed["exit"] == ExitCode.DONE
        assert stopped["losses"] + resumed["losses"] == straight["losses"]  # floats compared exactly
        for key in digests:
            assert resumed[key] == straight[key], key
    events, _ = control.read_events(events_dir)
    committed = [e for e in events if e.kind == "checkpoint_committed" and e.emergency]
    assert [e.step for e in committed] == [stop_at]
    assert committed[0].request_id == f"stop-{stop_at - 1}" and committed[0].deadline is not None
    assert [e.kind for e in events if e.kind in ("stopping", "resumed")] == ["stopping", "resumed"]
