"""`spotrelay simulate --workers N`: the same JSON for any N; a failing run, a killed worker or Ctrl-C
ends every worker, with one line."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
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


def _wait(condition: Callable[[], bool], what: str, limit_s: float = 300.0) -> None:
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.05)


def test_any_number_of_workers_writes_the_same_json(tmp_path: Path) -> None:
    # the synthetic market (its slot grants number nodes across runs) and several jobs, seeds and policies
    args = ["simulate", "--trace-format", "synthetic", "--nodes", "16", "--job-hours", "48", "--jobs", "2",
            "--seeds", "2", "--regions", "us-east-1,us-west-2", "--switch", "spares=1"]
    docs, before = [], set(_workers_of(os.getpid()))  # (another test's, if any, are not ours)
    for workers in ("1", "2", "3"):
        out = tmp_path / f"w{workers}.json"
        result = CliRunner().invoke(app, [*args, "--workers", workers, "--json", str(out)])
        assert result.exit_code == 0, result.output
        docs.append(out.read_bytes())
    assert docs[0] == docs[1] == docs[2]
    assert b'"spotrelay"' in docs[0] and b'"events"' in docs[0]
    assert set(_workers_of(os.getpid())) <= before



def test_a_sweep_on_a_terminal_shows_its_progress_and_the_same_result(tmp_path: Path, monkeypatch) -> None:
    """stderr a terminal: a progress line counts every run (in this process and from workers, which end
    in any order); a pipe gets none; the JSON is the same either way."""
    import io

    from rich.console import Console

    import spotrelay.cli.simulate as cli

    args = ["simulate", "--trace-format", "synthetic", "--nodes", "8", "--job-hours", "24", "--jobs", "2",
            "--seeds", "2", "--policies", "spotrelay,on-demand,price-limit"]  # 12 runs
    docs = []
    for workers, terminal in (("1", True), ("2", True), ("2", False)):
        shown = io.StringIO()
        monkeypatch.setattr(cli, "err", Console(file=shown, force_terminal=terminal, color_system=None, width=120))
        out = tmp_path / f"w{workers}{terminal}.json"
        result = CliRunner().invoke(app, [*args, "--workers", workers, "--json", str(out)])
        assert result.exit_code == 0, result.output
        docs.append(out.read_bytes())
        if terminal:
            assert "simulating" in shown.getvalue() and "12/12 runs" in shown.getvalue(), shown.getvalue()
        else:
            assert shown.getvalue() == ""
    assert docs[0] == docs[1] == docs[2]

def test_a_run_failing_in_a_worker_is_one_line_and_ends_the_workers() -> None:
    before = set(_workers_of(os.getpid()))
    result = CliRunner().invoke(app, ["simulate", "--trace", str(TRACE), "--nodes", "4", "--job-hours", "1",
                                      "--jobs", "2", "--workers", "2", "--switch", "min_nodes=2",
                                      "--switch", "wall_time_weight=2"])
    assert result.exit_code == 2 and result.output.strip().count("\n") == 0, result.output
    assert "resources.wall_time_weight" in result.output and "Traceback" not in result.output
    assert set(_workers_of(os.getpid())) <= before


def test_a_workers_error_comes_back_whole_on_one_line(tmp_path: Path) -> None:
    """A worker sent back only its error's first line: a trace named with a newline came back as
    "spotrelay seed 0 job 1: bad", without the file's line or the cause after it."""
    bad = tmp_path / "bad\nname.csv"
    bad.write_text("10,add,a\n20,vanish,a\n")
    result = CliRunner().invoke(app, ["simulate", "--trace", str(bad), "--nodes", "4", "--job-hours", "1",
                                      "--jobs", "2", "--workers", "2", "--policies", "spotrelay"])
    assert result.exit_code == 2 and result.output.strip().count("\n") == 0, result.output
    assert f"{tmp_path}/bad name.csv:2: action 'vanish' is not 'add' or 'remove'" in result.output, result.output


def test_a_bug_in_a_worker_reads_as_the_same_bug_in_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """An unexpected exception (a switch no run takes: SpotrelayRun's TypeError) is "unexpected TypeError ...
    (a bug ...)", exit 1, in this process; from a worker it came back as a usage error, exit 2."""
    import spotrelay.sim.runner as runner

    monkeypatch.setattr(runner, "parse_switch", lambda text: ("no_such_switch", 1))  # (past the CLI's check)
    args = ["simulate", "--trace", str(TRACE), "--nodes", "4", "--job-hours", "1", "--jobs", "2",
            "--policies", "spotrelay", "--switch", "spares=1"]
    here = CliRunner().invoke(app, [*args, "--workers", "1"])
    before = set(_workers_of(os.getpid()))
    there = CliRunner().invoke(app, [*args, "--workers", "2"])
    for result in (here, there):
        assert result.exit_code == 1 and result.output.strip().count("\n") == 0, result.output
        assert result.output.startswith("error: unexpected TypeError: "), result.output
        assert "no_such_switch" in result.output and result.output.rstrip().endswith("and report it)")
    assert re.match(r"error: unexpected TypeError: spotrelay seed 0 job [01]: ", there.output), there.output
    assert set(_workers_of(os.getpid())) <= before


def test_a_bug_in_a_worker_keeps_its_traceback_for_a_report() -> None:
    from spotrelay.errors import RemoteBug
    from spotrelay.sim.build import MarketOptions
    from spotrelay.sim.job import JobModel
    from spotrelay.sim.parallel import run_parallel
    from spotrelay.sim.runner import SimOptions

    opts = SimOptions(market=MarketOptions(trace_format="synthetic"), job=JobModel(nodes=4, job_hours=1),
                      policies=("spotrelay",), jobs=2, spotrelay_switches={"no_such_switch": 1})
    with pytest.raises(RemoteBug) as caught:
        run_parallel(opts, 2)
    assert caught.value.kind == "TypeError" and "\n" not in str(caught.value)
    assert "Traceback" in caught.value.__notes__[0] and "TypeError" in caught.value.__notes__[0]


class _ExitWhenLoaded:
    """Unpickled in a worker as it starts (in its options), it ends that worker before it reads a run."""

    def __reduce__(self) -> tuple[Callable[[int], None], tuple[int]]:
        return os._exit, (3,)


def test_a_worker_gone_before_its_first_run_is_the_died_line() -> None:
    """Its pipe, with the unread task in it, is reset: the parent's read raised ConnectionResetError, which
    the CLI printed as "cannot connect: ...; is the endpoint (or the twin) running?"."""
    from spotrelay.sim.build import MarketOptions
    from spotrelay.sim.job import JobModel
    from spotrelay.sim.parallel import _DIED, run_parallel
    from spotrelay.sim.runner import SimOptions

    before = set(_workers_of(os.getpid()))
    opts = SimOptions(market=MarketOptions(trace_format="synthetic"), job=JobModel(nodes=4, job_hours=1),
                      policies=("spotrelay",), jobs=2, spotrelay_switches={"x": _ExitWhenLoaded()})
    with pytest.raises(ValueError, match=re.escape(_DIED)):
        run_parallel(opts, 2)
    assert set(_workers_of(os.getpid())) <= before


def _start_long_simulation() -> subprocess.Popen[bytes]:
    """A 2-worker simulation long enough to be running still when the test acts (4 ten-year jobs, minutes each)."""
    # (as a terminal starts it: Ctrl-C raises KeyboardInterrupt. A process started in the background by a
    # non-interactive shell, a `make test &` say, inherits SIGINT ignored, and so would this one)
    start = "import signal; signal.signal(signal.SIGINT, signal.default_int_handler); " \
            "from spotrelay.cli.main import app; app()"
    cmd = [sys.executable, "-c", start, "simulate", "--trace-format",
           "synthetic", "--nodes", "32", "--job-hours", "87600", "--jobs", "4", "--policies", "spotrelay",
           "--workers", "2"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)


def _interrupt(proc: subprocess.Popen[bytes], act: Callable[[list[int]], None]) -> tuple[bytes, list[int]]:
    """Once both workers run, ``act(workers)``; then the output and the workers' pids."""
    try:
        _wait(lambda: len(_workers_of(proc.pid)) == 2 or proc.poll() is not None, "two workers")
        workers = _workers_of(proc.pid)
        assert proc.poll() is None and len(workers) == 2
        act(workers)
        output, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return output, workers


def test_ctrl_c_ends_the_workers_without_a_traceback() -> None:
    proc = _start_long_simulation()
    # what a terminal's Ctrl-C does: SIGINT to the whole process group
    output, workers = _interrupt(proc, lambda _: os.killpg(proc.pid, signal.SIGINT))
    assert proc.returncode != 0
    assert b"Traceback" not in output and b"KeyboardInterrupt" not in output, output.decode()
    # the parent joined its workers before it exited: none is left
    assert not [pid for pid in workers if Path(f"/proc/{pid}").exists()]


def _cpu_s(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def test_a_killed_worker_ends_the_simulation_with_one_line() -> None:
    def kill(workers: list[int]) -> None:
        # once it is inside a run (its imports take ~0.5 s of CPU): the pool would start another worker,
        # and that run's answer would never come
        _wait(lambda: _cpu_s(workers[0]) > 2.0, "a worker inside a run")
        os.kill(workers[0], signal.SIGKILL)  # as the OOM killer would

    proc = _start_long_simulation()
    output, workers = _interrupt(proc, kill)
    assert proc.returncode == 2, output.decode()
    assert output.strip().count(b"\n") == 0 and b"ended without its result" in output, output.decode()
    assert not [pid for pid in workers if Path(f"/proc/{pid}").exists()]


def test_a_small_run_stays_in_this_process_and_a_sweep_takes_every_cpu() -> None:
    """Starting workers costs ~0.5-1 s each: a default run (a few node-days) does not pay for it."""
    from spotrelay.sim.job import JobModel
    from spotrelay.sim.parallel import default_workers
    from spotrelay.sim.runner import SimOptions

    assert default_workers(SimOptions(seeds=3, job=JobModel(nodes=16, job_hours=72))) == 1
    assert default_workers(SimOptions(jobs=100, policies=("spotrelay",), job=JobModel(nodes=32, job_hours=730))) \
        == (os.cpu_count() or 1)  # fmt: skip
    assert default_workers(SimOptions(policies=("spotrelay",), job=JobModel(nodes=64, job_hours=10_000))) == 1
