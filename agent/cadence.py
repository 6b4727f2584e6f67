"""``checkpoint.every_minutes: auto`` on the trainer's side: the interval from this rank's own saves.

The controller gives the mean time between the gang's losses without a notice (the environment's
SPOTRELAY_CHECKPOINT_LOSS_INTERVAL_S); this rank gives what a save costs it: the snapshot stall the
loop waited for, and how long its last periodic save took to commit (a floor: saving faster than
that only queues uploads). spotrelay/contracts/cadence.py turns them into the interval. Each rank may
measure its own: the due flag is agreed with an all-reduce (MAX), so the shortest interval wins.

Pure: no clock, no torch. The session feeds it its saves (``AutoCadence``).
"""

from __future__ import annotations

from agent.notice_window import SaveLike
from spotrelay.contracts.cadence import trainer_floor_s, trainer_interval_s

# Before this rank's first save: small, so the first save comes early and measures the real stall
# (erring short costs one snapshot; erring long risks the work of a loss that comes meanwhile).
PRIOR_STALL_S = 1.0
STALL_WEIGHT = 0.5  # of a new measurement in the running estimate: a save on a busy host is not the rule
MATERIAL = 0.1  # a relative change of the interval worth a log line


class AutoCadence:
    def __init__(
        self, loss_interval_s: float | None, min_s: float, max_s: float, prior_stall_s: float = PRIOR_STALL_S
    ) -> None:
        self.loss_interval_s, self.min_s, self.max_s = loss_interval_s, min_s, max_s
        self.stall_s = prior_stall_s
        self.upload_s = 0.0  # the last periodic save's snapshot-to-commit time
        self._measured = False
        self._timing: list[SaveLike] = []  # periodic saves whose commit time is not known yet
        self._reported: float | None = None

    def saved(self, job: SaveLike, stall_s: float) -> None:
        """Every save's snapshot stall; a periodic one's commit time once it is done (``boundary``)."""
        w = STALL_WEIGHT if self._measured else 1.0  # the prior is no measurement
        self.stall_s, self._measured = w * stall_s + (1.0 - w) * self.stall_s, True
        if not job.emergency:  # the emergency lane is faster: not what periodic saves queue behind
            self._timing.append(job)

    def boundary(self) -> float | None:
        """Once per step: learn the commit time of finished periodic saves; the interval when it
        moved materially since it was last returned (for a log line), else None."""
        for job in [j for j in self._timing if j.done.is_set()]:
            self._timing.remove(job)
            if job.error is None:
                self.upload_s = job.flush_s
        now = self.interval_s
        if self._reported is None or abs(now - self._reported) > MATERIAL * self._reported:
            self._reported = now
            return now
        return None

    @property
    def floor_s(self) -> float:
        return trainer_floor_s(self.min_s, self.upload_s)

    @property
    def interval_s(self) -> float:
        return trainer_interval_s(self.stall_s, self.upload_s, self.loss_interval_s, self.min_s, self.max_s)
