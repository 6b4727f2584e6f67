"""Runs of a sweep in worker processes: every (seed, policy, job) run is independent of the others.

A run owns its random state (seeded from its seed and job) and reads the seed's market, whose caches
only memoise (its slot grants' serial numbers, which count on across the runs of one process, are only
identities: the engine tests them for membership, never iterates them), so where a run is computed
cannot change it. The parent sends plain inputs (the options once per worker, then ``(seed, policy,
job, start)``), gets each run's ``RunResult`` back and merges them in the in-process order
(``runner.merge_seed``), so the report, and its JSON, is the same for any number of workers. Workers
use the 'spawn' context (a fresh interpreter: nothing inherited from the parent's state) and ignore
SIGINT: Ctrl-C reaches the parent, which kills them; so do the first run that fails (its error comes
back on one line, all of its message: a ``ValueError`` as one, a refusal; anything else as a
``RemoteBug`` naming its type, a bug, as the CLI says it in its own process) and a worker that dies
(killed, out of memory: its run's answer would never come). Each worker has a pipe of its own, not
``multiprocessing.Pool``'s shared queues: stopping a Pool terminates workers that may hold a queue's
lock (one sending its result), and then waits for ever for it (seen once: a failed run's sweep hung in
``Pool.terminate``); a private pipe has no lock to leave held, and a dead worker shows as its process
sentinel. As with any 'spawn' caller, a script that asks for workers needs the
``if __name__ == "__main__":`` guard.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import traceback
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from multiprocessing import resource_tracker
from multiprocessing.connection import Connection, wait
from typing import Any, cast

from spotrelay.errors import RemoteBug
from spotrelay.sim.job import REF_TYPE
from spotrelay.sim.runner import Progress, RunResult, SimOptions, job_starts, merge_seed, run_count, run_one

Task = tuple[int, str, int, float]  # seed, policy, job index, start time
_OPTS: SimOptions | None = None
_MARKETS: dict[int, Any] = {}  # this worker's markets, by seed (built once per seed)


# Below this much simulated work (node-hours of training asked for, over every run) one process is done
# in about a second or less, and starting workers (~0.5-1 s of imports each) would cost more than it saves.
AUTO_MIN_NODE_HOURS = 200_000


def default_workers(opts: SimOptions | None = None) -> int:
    """The CPU count; 1 (this process) for a sweep of ``opts`` too small to repay starting workers."""
    if opts is not None:
        runs = run_count(opts)
        hours = opts.job.total_steps * opts.job.step_s(REF_TYPE) / 3600
        if runs < 2 or runs * opts.job.nodes * hours < AUTO_MIN_NODE_HOURS:
            return 1
    return os.cpu_count() or 1


def _init(opts: SimOptions) -> None:
    global _OPTS
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and ends the pool
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # blocked at the start (_sigint_blocked)
    _OPTS = opts
    _MARKETS.clear()


def _work(task: Task) -> tuple[Task, str, Any]:
    """One run in a worker: (task, "ok", RunResult), (task, "error", one-line message) for a refusal (a
    ValueError, as the CLI reads one in its own process) or (task, "bug", (type name, one-line message,
    traceback)) for anything else; never raises."""
    from spotrelay.sim.build import build_market

    seed, policy, job, start = task
    assert _OPTS is not None
    try:
        if seed not in _MARKETS:
            _MARKETS.clear()  # tasks come in seed order: one market held at a time
            _MARKETS[seed] = build_market(_OPTS.market, seed)
        return task, "ok", run_one(_OPTS, _MARKETS[seed], policy, seed, job, start)
    except Exception as exc:  # sent back as text: an exception's pickling is not to be relied on
        # all of it on one line, as the CLI prints an error of this process: a trace's name with a newline
        # (its file and line after it) or pydantic's lines (the input under the field) were cut at the first
        text = f"{policy} seed {seed} job {job}: {' '.join(str(exc).split())}"
        if isinstance(exc, ValueError):
            return task, "error", text
        return task, "bug", (type(exc).__name__, text, traceback.format_exc())


@contextmanager
def _sigint_blocked() -> Iterator[None]:
    """SIGINT held back while the pool starts: its processes and threads inherit the mask (a Ctrl-C
    while a worker imports stays silent there) and a Ctrl-C meanwhile reaches the parent on leaving."""
    if not hasattr(signal, "pthread_sigmask") or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _serve(conn: Connection, opts: SimOptions) -> None:
    """A worker: the runs the parent sends, one at a time, until it sends None or goes away."""
    _init(opts)
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None:
            return
        conn.send(_work(task))


_EXIT_S = 10.0  # how long a worker told it is done may take to exit before it is killed
_DIED = "a simulation worker process ended without its result (killed? out of memory?)"


def _give(conn: Connection, tasks: Iterator[Task], busy: set[Connection]) -> None:
    """The worker at ``conn`` gets the next task, if any is left (its answer names the task)."""
    task = next(tasks, None)
    if task is None:
        return
    try:
        conn.send(task)
    except OSError:  # (its end is closed: it died after its last answer)
        raise ValueError(_DIED) from None
    busy.add(conn)


def run_parallel(opts: SimOptions, workers: int, progress: Progress | None = None) -> list[RunResult]:
    """Every seed's runs over ``workers`` processes; the same list ``runner.run_seed`` gives in turn.
    Runs are taken as they end (in any order: ``progress`` counts each then) and merged in task order."""
    tasks: list[Task] = [(seed, policy, j, start) for seed in range(opts.seeds)
                         for policy in opts.policies for j, start in enumerate(job_starts(seed, opts.jobs))]
    results: dict[Task, RunResult] = {}
    ctx = multiprocessing.get_context("spawn")
    crew: list[tuple[Any, Connection]] = []
    done = False
    try:
        # started first: starting it unblocks SIGINT on the way out (multiprocessing.resource_tracker)
        resource_tracker.ensure_running()
        with _sigint_blocked():
            for i in range(min(workers, len(tasks))):
                mine, theirs = ctx.Pipe()
                proc = ctx.Process(target=_serve, args=(theirs, opts), name=f"spotrelay-sim-{i + 1}", daemon=True)
                proc.start()
                theirs.close()  # (the worker's end: closed here, it is gone once the worker is)
                crew.append((proc, mine))
        queue = iter(tasks)
        busy: set[Connection] = set()
        for _, conn in crew:
            _give(conn, queue, busy)
        while busy:
            by_sentinel = {proc.sentinel: conn for proc, conn in crew if conn in busy}
            for ready in wait([*busy, *by_sentinel]):
                conn = by_sentinel[ready] if isinstance(ready, int) else cast(Connection, ready)
                if conn not in busy:
                    continue  # (its answer was read above: a sentinel with it in one wake-up)
                try:
                    task, status, value = conn.recv()
                except (EOFError, OSError):  # killed (out of memory, a signal): that run's answer never comes
                    # (one gone before it read its task resets the pipe: ECONNRESET read "cannot connect")
                    raise ValueError(_DIED) from None
                busy.discard(conn)
                if status == "error":
                    raise ValueError(value)
                if status == "bug":  # not a refusal: the CLI says it as the same bug in its own process
                    raise RemoteBug(*value)
                results[task] = value
                if progress is not None:
                    progress(1)
                _give(conn, queue, busy)
        for _, conn in crew:
            with suppress(OSError):  # (gone after its last answer: every result is in, the finally reaps it)
                conn.send(None)
        done = True
    finally:  # every worker ends here: told it is done, or killed (an error, a dead one, Ctrl-C)
        for proc, conn in crew:
            if done:
                proc.join(_EXIT_S)
            if proc.exitcode is None:
                proc.kill()
                proc.join()
            conn.close()
    out: list[RunResult] = []
    for seed in range(opts.seeds):
        out.extend(merge_seed([[results[t] for t in tasks if t[0] == seed and t[1] == policy]
                               for policy in opts.policies]))
    return out
