"""Waiting in the e2e tests: one helper for every "until this is true" loop.

A wait only catches a hang: its bound is far above any run on a loaded machine, and what a test
asserts afterwards never depends on how long the condition took to become true.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from spotrelay.domain.models import Job
    from spotrelay.local.twin import Twin

T = TypeVar("T")
HANG_S = 900.0  # a twin job on a 2-core machine shared with other heavy runs stays far below this


def wait_for(value: Callable[[], T | None], what: str | Callable[[], str], timeout: float = HANG_S,
             every: float = 0.2) -> T:
    """Poll ``value`` until it returns something truthy and return that; fail with ``what`` (what
    did not happen; a callable is asked at the failure, so it can describe the last state seen)."""
    deadline = time.monotonic() + timeout
    while True:
        found = value()
        if found:
            return found
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what() if callable(what) else what} (gave up after {timeout:.0f} s: a hang)")
        time.sleep(every)


def wait_terminal(twin: Twin, key: str, timeout: float = HANG_S) -> Job:
    """The job that the submission ``key`` became, once it reached a terminal status."""
    seen: list[Job | None] = [None]

    def ended() -> Job | None:
        seen[0] = job = twin.job_for_key(key)
        return job if job is not None and job.status.terminal else None

    def last() -> str:
        job = seen[0]
        return f"{key} did not end; last seen: {job and (job.status, job.attempt, job.reasons)}"

    return wait_for(ended, last, timeout, every=1.0)
