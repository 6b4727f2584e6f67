"""`spotrelay simulate --workers N`: the same JSON for any N; a failing run or Ctrl-C ends every worker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from typer.testing import CliRunner

from spotrelay.cli.main import app

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "spotrelay" / "local" / "data" / "bamboo-g4dn-trace.csv"


def _workers_of(pid: int) -> list[int]:
    """Live multiprocessing workers (spawned interpreters) whose parent is ``pid`` (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmd = (entry / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue  # it ended meanwhile
        if ppid == pid and b"spawn_main" in cmd:
            found.append(int(entry.name))
    return found


def _wait(condition, what: str, limit_s: float = 300.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.05)


def test_any_number_of_workers_writes_the_same_json(tmp_path: Path) -> None:
    # the synthetic market (its slot grants number nodes across runs) and several jobs, seeds and policies
    args = ["simulate", "--trace-format", "synthetic", "--nodes", "16", "--job-hours", "48", "--jobs", "2",
            "--seeds", "2", "--regions", "us-east-1,us-west-2", "--switch", "spares=1"]
    docs = []
    for workers in ("1", "2", "3"):
        out = tmp_path / f"w{workers}.json"
        result = CliRunner().invoke(app, [*args, "--workers", workers, "--json", str(out)])
        assert result.exit_code == 0, result.output
        docs.append(out.read_bytes())
    assert docs[0] == docs[1] == docs[2]
    assert b'"spotrelay"' in docs[0] and b'"events"' in docs[0]
    assert not _workers_of(os.getpid())


def test_a_run_failing_in_a_worker_is_one_line_and_ends_the_workers() -> None:
    result = CliRunner().invoke(app, ["simulate", "--trace", str(TRACE), "--nodes", "4", "--job-hours", "1",
                                      "--jobs", "2", "--workers", "2", "--switch", "min_nodes=2",
                                      "--switch", "wall_time_weight=2"])
    assert result.exit_code == 2 and result.output.strip().count("\n") == 0, result.output
    assert "resources.wall_time_weight" in result.output and "Traceback" not in result.output
    assert not _workers_of(os.getpid())


def test_ctrl_c_ends_the_workers_without_a_traceback() -> None:
    # long enough that it is still running when interrupted (it would take minutes)
    cmd = [sys.executable, "-c", "from spotrelay.cli.main import app; app()", "simulate", "--trace-format",
           "synthetic", "--nodes", "32", "--job-hours", "20000", "--jobs", "4", "--policies", "spotrelay",
           "--workers", "2"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        _wait(lambda: len(_workers_of(proc.pid)) == 2 or proc.poll() is not None, "two workers")
        workers = _workers_of(proc.pid)
        assert proc.poll() is None and len(workers) == 2
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole process group
        output, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0
    assert b"Traceback" not in output and b"KeyboardInterrupt" not in output, output.decode()
    # the parent joined its workers before it exited: none is left
    assert not [pid for pid in workers if Path(f"/proc/{pid}").exists()]
