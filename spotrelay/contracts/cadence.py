"""The interval of ``checkpoint.every_minutes: auto``, shared by the controller and the trainer.

Here, not in the domain, because the agent may import only the contracts
(tests/unit/test_agent_boundary.py); the derivation and the controller's half (the loss interval)
are in spotrelay/domain/cadence.py, which re-exports it.
"""

from __future__ import annotations

import math

AUTO = "auto"  # ``every_minutes: auto``: the cadence from the market


class MinutesOrAuto:
    """``every_minutes`` read both ways, for the spec's checkpoint section and the trainer's settings."""

    every_minutes: float | str | None
    auto_min_minutes: float
    auto_max_minutes: float

    def check_auto_bounds(self) -> None:
        if self.auto_min_minutes > self.auto_max_minutes:
            raise ValueError("auto_min_minutes is above auto_max_minutes")

    @property
    def auto(self) -> bool:
        """The cadence comes from the market and the trainers' measured saves."""
        return self.every_minutes == AUTO

    @property
    def fixed_minutes(self) -> float | None:
        """``every_minutes`` when it is a number."""
        return None if isinstance(self.every_minutes, str) else self.every_minutes


def auto_interval_s(stall_s: float, loss_interval: float | None, floor_s: float, ceiling_s: float) -> float:
    """Seconds between periodic checkpoints: ``sqrt(2 x stall x loss interval)`` within
    ``[floor_s, ceiling_s]`` (the ceiling when no loss is expected). A caller puts the upload time of
    one checkpoint in the floor: saving faster than the last one reaches S3 only queues uploads."""
    ceiling_s = max(ceiling_s, floor_s)  # (an upload slower than the ceiling: the floor wins)
    if loss_interval is None or not math.isfinite(loss_interval) or loss_interval <= 0:
        return ceiling_s
    optimum = math.sqrt(2.0 * max(stall_s, 0.0) * loss_interval)
    return min(max(optimum, floor_s), ceiling_s)


def trainer_floor_s(min_s: float, upload_s: float) -> float:
    """No shorter than the spec's minimum nor than one upload of the trainer's checkpoint."""
    return max(min_s, upload_s)


def trainer_interval_s(stall_s: float, upload_s: float, loss_interval: float | None, min_s: float,
                       max_s: float) -> float:
    """What a trainer with ``every_minutes: auto`` keeps (agent/cadence.py; the simulator's trainers):
    the optimum within ``trainer_floor_s`` and the spec's maximum (all in seconds)."""
    return auto_interval_s(stall_s, loss_interval, trainer_floor_s(min_s, upload_s), max_s)
