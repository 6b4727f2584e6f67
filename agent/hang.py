"""Hang detection on the node: no finished step for ``hang_after_s`` while the trainer lives.

The session writes ``progress.json`` after every step; the agent sees a hang when that step has
not moved for the configured time. Before the launch's first step the limit is at least
``STARTUP_S`` (imports, rendezvous and a resume that downloads a large checkpoint take a while).
Before acting, it dumps every training process's Python stacks: with ``py-spy dump`` when it is
installed (works even when the process holds the GIL in C), else by sending SIGUSR1 to the pids the
session registered in ``<control>/pids/`` (each one armed ``faulthandler`` on SIGUSR1 to write to
``<control>/stacks/rank-<R>.txt``). Only registered pids are signalled: SIGUSR1 kills a process
that did not arm a handler.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from spotrelay.contracts import control

PIDS_DIR = "pids"
STACKS_DIR = "stacks"
STARTUP_S = 600.0


class HangWatch:
    def __init__(self, control_dir: Path, after_s: float | None, clock: Callable[[], float] = time.time) -> None:
        self.control_dir, self.after_s, self.clock = control_dir, after_s, clock
        self.reset()

    def reset(self) -> None:
        """A (re)launch: the clock starts again."""
        self._step: int | None = control.read_progress(self.control_dir)
        self._since = self.clock()
        self._started = False
        self.fired = False

    def check(self, now: float) -> int | None:
        """The stuck step (progress so far, 0 before the first) once the limit passes; else None."""
        if self.after_s is None or self.fired:
            return None
        step = control.read_progress(self.control_dir)
        if step != self._step:
            self._step, self._since, self._started = step, now, True
            return None
        if now - self._since < (self.after_s if self._started else max(self.after_s, STARTUP_S)):
            return None
        self.fired = True
        return step or 0


def register_stack_dump(control_dir: Path, rank: int) -> None:
    """In a training process: arm faulthandler on SIGUSR1 and publish the pid for the agent."""
    import faulthandler

    stacks = control_dir / STACKS_DIR
    stacks.mkdir(parents=True, exist_ok=True)
    out = open(stacks / f"rank-{rank}.txt", "w")  # noqa: SIM115 - faulthandler writes to it until exit
    faulthandler.register(signal.SIGUSR1, file=out, all_threads=True, chain=False)
    control.write_atomic(control_dir / PIDS_DIR / f"rank-{rank}.pid", str(os.getpid()))


def _pids(control_dir: Path) -> dict[str, int]:
    found = {}
    for path in sorted((control_dir / PIDS_DIR).glob("rank-*.pid")):
        try:
            found[path.stem] = int(path.read_text().strip())
        except (OSError, ValueError):
            continue
    return found


def dump_stacks(control_dir: Path, wait_s: float = 2.0, py_spy: str | None = None) -> str:
    """Every registered training process's stacks, as one text ('' when none could be read)."""
    pids = _pids(control_dir)
    tool = py_spy if py_spy is not None else shutil.which("py-spy")
    parts: list[str] = []
    signalled: list[str] = []
    for name, pid in pids.items():
        if tool:
            try:
                done = subprocess.run([tool, "dump", "--pid", str(pid)], capture_output=True, text=True,
                                      timeout=30, check=False)  # fmt: skip
                if done.returncode == 0:
                    parts.append(f"== {name} (pid {pid}, py-spy) ==\n{done.stdout}")
                    continue
            except (OSError, subprocess.TimeoutExpired):
                pass
        try:
            os.kill(pid, signal.SIGUSR1)
            signalled.append(name)
        except (ProcessLookupError, PermissionError):
            parts.append(f"== {name} (pid {pid}) is gone ==\n")
    if signalled:
        time.sleep(wait_s)  # faulthandler writes from the signal handler, at once unless the GIL is held
        for name in signalled:
            path = control_dir / STACKS_DIR / f"{name}.txt"
            text = path.read_text(errors="replace") if path.exists() else ""
            parts.append(f"== {name} (pid {pids[name]}, faulthandler) ==\n{text or '(nothing written)'}\n")
    return "\n".join(parts)
