"""A checkpoint cadence from the market (``checkpoint.every_minutes: auto``): Young's optimum.

A periodic checkpoint costs the training loop its snapshot stall ``d``; a loss that comes without a
usable notice (an unannounced reclaim, a hardware failure) costs on average half an interval of redone
work. Per unit of time the two cost ``d / T + T / (2 M)``, ``M`` the mean time between such losses of
the gang, least at ``T = sqrt(2 d M)`` (Young 1974; Daly 2006's higher-order terms matter only when T
nears M, which the ceiling keeps it from). Announced reclaims do not enter: the notice's own checkpoint
keeps their work. The controller knows ``M`` (placement's interruption rate of the pool it launched
in): this module; the trainer knows ``d`` and how long an upload takes (it times its own saves): the
interval itself is spotrelay/contracts/cadence.py, which the agent may import (docs/checkpoints.md).
"""

from __future__ import annotations

import math

# the interval itself is a contract: the agent computes it and may not import the domain
from spotrelay.contracts.cadence import auto_interval_s as auto_interval_s
from spotrelay.contracts.cadence import trainer_interval_s as trainer_interval_s


def loss_interval_s(gang_interruptions_per_hour: float, unannounced_share: float) -> float | None:
    """Mean seconds between the gang's losses that come without a notice; None when none are expected.
    ``gang_interruptions_per_hour``: placement's (every node's rate, hardware failures included);
    ``unannounced_share``: placement's assumption of how many of them give no notice."""
    rate = gang_interruptions_per_hour * unannounced_share
    return 3600.0 / rate if rate > 0 and math.isfinite(rate) else None
