"""checkov, pinned, in its own virtual environment (.cache/checkov-venv): its dependencies conflict with ours.

``python -m tests.infrastructure.checkov_env`` (the Makefile) and the test both call :func:`ensure`, which
creates the venv on first use (a clean clone, CI) under a file lock, and reuses it when the pinned version
is already there.
"""

from __future__ import annotations

import fcntl
import json
import subprocess
import sys
from pathlib import Path

VERSION = "3.3.30"
ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".cache" / "checkov-venv"
CHECKOV = VENV / "bin" / "checkov"


def _installed() -> bool:
    if not CHECKOV.exists():
        return False
    probe = subprocess.run([str(CHECKOV), "--version"], capture_output=True, text=True, timeout=120)
    return probe.returncode == 0 and probe.stdout.strip() == VERSION


def ensure() -> Path:
    """The checkov executable at :data:`VERSION`, installed if missing."""
    VENV.parent.mkdir(parents=True, exist_ok=True)
    with open(VENV.parent / "checkov-venv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one installer at a time (xdist workers, make and pytest)
        if not _installed():
            base = getattr(sys, "_base_executable", sys.executable)
            subprocess.run([base, "-m", "venv", "--clear", str(VENV)], check=True, timeout=300)
            pip = [str(VENV / "bin" / "python"), "-m", "pip", "install", "-q"]
            subprocess.run([*pip, f"checkov=={VERSION}"], check=True, timeout=1200)
            if not _installed():
                raise RuntimeError(f"checkov {VERSION} did not install into {VENV}")
    return CHECKOV


def run(templates: list[Path]) -> list[dict[str, object]]:
    """checkov's JSON reports (one per framework run) for the CloudFormation templates."""
    args = [str(ensure()), "--framework", "cloudformation", "--compact", "--output", "json",
            "--skip-download"]
    for template in templates:
        args += ["--file", str(template)]
    result = subprocess.run(args, capture_output=True, text=True, timeout=900)
    # exit status 1 means "failed checks" (reported in the JSON); anything else is checkov itself failing
    if result.returncode not in (0, 1) or not result.stdout.strip().startswith(("[", "{")):
        raise RuntimeError(f"checkov exited {result.returncode}: {result.stderr[-2000:]}")
    report = json.loads(result.stdout)
    return report if isinstance(report, list) else [report]


if __name__ == "__main__":
    print(ensure())
