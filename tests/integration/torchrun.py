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


def torchrun(
    script: Path,
    tmp: Path,
    name: str,
    ckpt: Path,
    args: list[str],
    env: dict[str, str] | None = None,
    timeout: int = 400,
) -> None:
    """``script --checkpoint-dir ckpt --out tmp/name *args``; fails the test if a rank wrote nothing."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script)]
    cmd += ["--checkpoint-dir", str(ckpt), "--out", str(tmp / name), *args]
    full_env = {**os.environ, "PYTHONWARNINGS": "ignore", control.ENV_CONTROL_DIR: str(tmp / "control"), **(env or {})}
    done = subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=timeout, check=False)
    if not all((tmp / f"{name}.rank{r}.json").exists() for r in (0, 1)):
        pytest.fail(f"{name} wrote no result (rc {done.returncode}):\n{done.stderr[-4000:]}")


def result(tmp: Path, name: str, rank: int) -> dict[str, Any]:
    return dict(json.loads((tmp / f"{name}.rank{rank}.json").read_text()))
