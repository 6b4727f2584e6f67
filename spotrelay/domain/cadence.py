"""A checkpoint cadence from the market (``checkpoint.every_minutes: auto``): Young's optimum.

A periodic checkpoint costs the training loop its snapshot stall ``d``; a loss that comes without a
usable notice (an unannounced reclaim, a hardware failure) costs on average half an interval of redone
work. Per unit of time the two cost ``d / T + T / (2 M)``, ``M`` the mean time between such losses of
the gang, least at ``T = sqrt(2 d M)`` (Young 1974; Daly 2006's higher-order terms matter only when T
nears M, which the ceiling keeps it from). Announced reclaims do not enter: the notice's own checkpoint
keeps their work. The controller knows ``M`` (placement's interruption rate of the pool it launched
in); the trainer knows ``d`` and how long an upload takes (it times its own saves): each side gives
its half, the agent's environment carries the controller's (docs/checkpoints.md).
"""

from __future__ import annotations

import math


def loss_interval_s(gang_interruptions_per_hour: float, unannounced_share: float) -> float | None:
    """Mean seconds between the gang's losses that come without a notice; None when none are expected.
    ``gang_interruptions_per_hour``: placement's (every node's rate, hardware failures included);
    ``unannounced_share``: placement's assumption of how many of them give no notice."""
    rate = gang_interruptions_per_hour * unannounced_share
    return 3600.0 / rate if rate > 0 and math.isfinite(rate) else None


def auto_interval_s(stall_s: float, loss_interval: float | None, floor_s: float, ceiling_s: float) -> float:
    """Seconds between periodic checkpoints: ``sqrt(2 x stall x loss interval)`` within
    ``[floor_s, ceiling_s]`` (the ceiling when no loss is expected). A caller puts the upload time of
    one checkpoint in the floor: saving faster than the last one reaches S3 only queues uploads."""
    ceiling_s = max(ceiling_s, floor_s)  # (an upload slower than the ceiling: the floor wins)
    if loss_interval is None or not math.isfinite(loss_interval) or loss_interval <= 0:
        return ceiling_s
    optimum = math.sqrt(2.0 * max(stall_s, 0.0) * loss_interval)
    return min(max(optimum, floor_s), ceiling_s)


def trainer_interval_s(stall_s: float, upload_s: float, loss_interval: float | None, min_minutes: float,
                       max_minutes: float) -> float:
    """What a trainer with ``every_minutes: auto`` keeps (agent/training.py; the simulator's trainers):
    Young's optimum, no shorter than the spec's minimum nor than one upload of its checkpoint, no
    longer than the spec's maximum."""
    return auto_interval_s(stall_s, loss_interval, max(min_minutes * 60.0, upload_s), max_minutes * 60.0)
