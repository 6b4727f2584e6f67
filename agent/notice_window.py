"""Training through a spot notice: when the final save must start, from this node's measured flushes.

At the notice every rank snapshots at once (committed in the background on the emergency lane) and
keeps training. The final save starts at the last step boundary that still leaves room for it:

    now + step + pending + flush + margin >= deadline   ->   save now, then stop

``step`` is the slowest of the recent steps (the next step must end before the save starts),
``pending`` what the notice snapshot still needs (the final save queues behind it on the same
lane), ``flush`` the predicted snapshot-to-global-commit time of a save of this rank's size (at
least as long as the notice snapshot has been uploading, while it still is), and
``margin`` a fixed safety margin plus a share of ``flush``. Every rank evaluates it with its own
numbers; one all-reduce(MAX) makes the earliest rank's verdict everyone's (agent/stop.py).

Pure: no clock, no torch. The session feeds it times and its saves (``NoticeTraining``).
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Protocol

MB = 1_000_000


@dataclass(frozen=True)
class FlushSample:
    nbytes: int  # what this rank wrote for the save (shards and trainer state)
    seconds: float  # snapshot + plan + transfer + commit of that save
    emergency: bool  # the emergency lane (every connection, full priority) or the periodic one


class FlushPredictor:
    """Predicts how long a save of ``nbytes`` takes to commit, from this rank's recent saves.

    Saves on the emergency lane (the lane the final save uses) are preferred; without one, the
    periodic lane's (fewer connections, lower priority: slower, so the prediction errs early).
    Each sample is scaled to the size asked for, and the slowest of the recent ones wins. Without
    any sample: ``nbytes`` at ``prior_mb_s`` plus ``prior_overhead_s``.
    """

    def __init__(self, keep: int = 4, prior_mb_s: float = 100.0, prior_overhead_s: float = 1.0) -> None:
        if keep < 1 or prior_mb_s <= 0:
            raise ValueError("keep must be >= 1 and prior_mb_s > 0")
        self._samples: deque[FlushSample] = deque(maxlen=keep * 2)
        self.keep, self.prior_mb_s, self.prior_overhead_s = keep, prior_mb_s, prior_overhead_s

    def observe(self, sample: FlushSample) -> None:
        if sample.seconds > 0:
            self._samples.append(sample)

    @property
    def samples(self) -> list[FlushSample]:
        return list(self._samples)

    def predict(self, nbytes: int) -> float:
        urgent = [s for s in self._samples if s.emergency]
        recent = (urgent or list(self._samples))[-self.keep :]
        if not recent:
            return self.prior_overhead_s + nbytes / (self.prior_mb_s * MB)
        return max(s.seconds * (nbytes / s.nbytes if s.nbytes > 0 and nbytes > 0 else 1.0) for s in recent)


class StepTimer:
    """The slowest of the last ``keep`` step durations (a step holding a snapshot is longer)."""

    def __init__(self, keep: int = 8) -> None:
        self._durations: deque[float] = deque(maxlen=keep)
        self._last: float | None = None

    def tick(self, now: float) -> None:
        if self._last is not None and now >= self._last:
            self._durations.append(now - self._last)
        self._last = now

    def estimate(self) -> float:
        return max(self._durations, default=0.0)


@dataclass(frozen=True)
class Margin:
    fixed_s: float = 3.0
    share: float = 0.25  # of the predicted flush: uploads vary from save to save

    def of(self, flush_s: float) -> float:
        return self.fixed_s + self.share * flush_s


def final_save_due(
    now: float, deadline: float, step_s: float, flush_s: float, pending_s: float, margin_s: float
) -> bool:
    """True when one more step would leave too little time to commit a final save before the deadline."""
    return now + step_s + pending_s + flush_s + margin_s >= deadline


def with_inflight(predicted_s: float, inflight_elapsed_s: float | None) -> tuple[float, float]:
    """(flush, pending) for a final save while the notice snapshot may still be uploading.

    The final save is the same size on the same lane, so it takes at least as long as the
    in-flight snapshot has run so far; and it queues behind it, which needs what its prediction
    says is left, but never less than a quarter of it while it runs (it is already slower)."""
    if inflight_elapsed_s is None:
        return predicted_s, 0.0
    flush = max(predicted_s, inflight_elapsed_s)
    return flush, max(flush - inflight_elapsed_s, 0.25 * flush)


@dataclass
class NoticeWindow:
    """A notice the ranks agreed on: the snapshot taken at it, and the deadline (earliest wins)."""

    deadline: float
    notice_at: float
    notice_step: int
    request_id: str | None

    def tighten(self, deadline: float | None) -> None:
        if deadline is not None and deadline < self.deadline:
            self.deadline = deadline


class SaveLike(Protocol):
    """What the tracker reads of a save (agent.checkpoint.pipeline.SaveJob)."""

    started: float
    nbytes: int
    emergency: bool
    error: BaseException | None

    @property
    def done(self) -> threading.Event: ...

    @property
    def flush_s(self) -> float: ...


class NoticeTraining:
    """One rank's side of training through a notice: the flush times it learned from its own
    saves, its step times, and the window once the ranks agreed on a notice. Times are passed in."""

    def __init__(self, margin: Margin, prior_mb_s: float = 100.0) -> None:
        self.flush = FlushPredictor(prior_mb_s=prior_mb_s)
        self.steps = StepTimer()
        self.margin = margin
        self.window: NoticeWindow | None = None
        self.snapshot: SaveLike | None = None  # the save taken at the notice: the fallback
        self._timing: list[SaveLike] = []  # saves whose flush time is not learned yet
        self.save_bytes = 0

    def saved(self, job: SaveLike) -> None:
        self._timing.append(job)

    def boundary(self, now: float) -> None:
        """Once per step: the step's duration, and the flush time of every save that finished."""
        self.steps.tick(now)
        for job in [j for j in self._timing if j.done.is_set()]:
            self._timing.remove(job)
            if job.error is None and job.nbytes:
                self.flush.observe(FlushSample(job.nbytes, job.flush_s, job.emergency))
                self.save_bytes = job.nbytes

    def no_room(self, now: float, deadline: float) -> bool:
        """At the notice, with its snapshot just taken: is there no room for a step and a final save?"""
        flush = self.flush.predict(self.save_bytes)
        return final_save_due(now, deadline, self.steps.estimate(), flush, flush, self.margin.of(flush))

    def open(self, deadline: float, now: float, step: int, request_id: str | None, snapshot: SaveLike) -> float:
        """Train on: returns the flush time predicted for the final save."""
        self.window, self.snapshot = NoticeWindow(deadline, now, step, request_id), snapshot
        return self.flush.predict(self.save_bytes)

    def final_due(self, now: float) -> bool:
        if self.window is None:
            return False
        snap = self.snapshot
        nbytes = self.save_bytes or (snap.nbytes if snap is not None else 0)
        inflight = now - snap.started if snap is not None and not snap.done.is_set() else None
        flush, pending = with_inflight(self.flush.predict(nbytes), inflight)
        return final_save_due(now, self.window.deadline, self.steps.estimate(), flush, pending, self.margin.of(flush))
