"""Runs of a sweep in worker processes: every (seed, policy, job) run is independent of the others.

A run owns its random state (seeded from its seed and job) and reads the seed's market, whose caches
only memoise (its slot grants' serial numbers, which count on across the runs of one process, are only
identities: the engine tests them for membership, never iterates them), so where a run is computed
cannot change it. The parent sends plain inputs (the options once per worker, then ``(seed, policy,
job, start)``), gets each run's ``RunResult`` back and merges them in the in-process order
(``runner.merge_seed``), so the report, and its JSON, is the same for any number of workers. Workers
use the 'spawn' context (a fresh interpreter: nothing inherited from the parent's state) and ignore
SIGINT: Ctrl-C reaches the parent, which terminates them; so do the first run that fails (its error
comes back as a one-line ``ValueError``) and a worker that dies (killed, out of memory: its run's
answer would never come). As with any 'spawn' caller, a script that asks for workers needs the
``if __name__ == "__main__":`` guard.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing import resource_tracker
from typing import Any

from spotrelay.sim.job import REF_TYPE
from spotrelay.sim.runner import Progress, RunResult, SimOptions, job_starts, merge_seed, run_count, run_one

Task = tuple[int, str, int, float]  # seed, policy, job index, start time
_OPTS: SimOptions | None = None
_POLL_S = 1.0  # how often the parent checks, while it waits for a run, that no worker died
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
    """One run in a worker: (task, "ok", RunResult) or (task, "error", one-line message); never raises."""
    from spotrelay.sim.build import build_market

    seed, policy, job, start = task
    assert _OPTS is not None
    try:
        if seed not in _MARKETS:
            _MARKETS.clear()  # tasks come in seed order: one market held at a time
            _MARKETS[seed] = build_market(_OPTS.market, seed)
        return task, "ok", run_one(_OPTS, _MARKETS[seed], policy, seed, job, start)
    except Exception as exc:  # sent back as text: an exception's pickling is not to be relied on
        text = str(exc).splitlines()[0] if str(exc) else ""
        prefix = "" if isinstance(exc, ValueError) else f"{type(exc).__name__}: "
        return task, "error", f"{policy} seed {seed} job {job}: {prefix}{text}"


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


def _pool_pids() -> set[int | None]:
    """This process's live pool workers (multiprocessing names them SpawnPoolWorker-N)."""
    return {p.pid for p in multiprocessing.active_children() if p.name.startswith("SpawnPoolWorker")}


def run_parallel(opts: SimOptions, workers: int, progress: Progress | None = None) -> list[RunResult]:
    """Every seed's runs over ``workers`` processes; the same list ``runner.run_seed`` gives in turn.
    Runs are taken as they end (in any order: ``progress`` counts each then) and merged in task order."""
    tasks: list[Task] = [(seed, policy, j, start) for seed in range(opts.seeds)
                         for policy in opts.policies for j, start in enumerate(job_starts(seed, opts.jobs))]
    results: dict[Task, RunResult] = {}
    ctx = multiprocessing.get_context("spawn")
    pool = None
    try:
        # started first: starting it unblocks SIGINT on the way out (multiprocessing.resource_tracker)
        resource_tracker.ensure_running()
        with _sigint_blocked():
            pool = ctx.Pool(processes=min(workers, len(tasks)), initializer=_init, initargs=(opts,))
        started = _pool_pids()
        answers = pool.imap_unordered(_work, tasks, chunksize=1)
        for _ in tasks:
            while True:
                try:
                    task, status, value = answers.next(timeout=_POLL_S)
                    break
                except multiprocessing.TimeoutError:
                    # a worker killed (out of memory, a signal) takes its run with it and the pool starts
                    # another: that run's answer would never come
                    if not started <= _pool_pids():
                        raise ValueError("a simulation worker process ended without its result "
                                         "(killed? out of memory?)") from None
            if status == "error":
                raise ValueError(value)
            results[task] = value
            if progress is not None:
                progress(1)
        pool.close()
    finally:
        if pool is not None:  # after close() the workers are done; else (an error, Ctrl-C) they are stopped
            pool.terminate()
            pool.join()
    out: list[RunResult] = []
    for seed in range(opts.seeds):
        out.extend(merge_seed([[results[t] for t in tasks if t[0] == seed and t[1] == policy]
                               for policy in opts.policies]))
    return out
