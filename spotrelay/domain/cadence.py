"""A checkpoint cadence from the market (``checkpoint.every_minutes: auto``): Young's optimum.

A periodic checkpoint costs the training loop its snapshot stall ``d``; a loss that comes without a
usable notice (an unannounced reclaim, a hardware failure) costs on average half an interval of redone
work. Per unit of time the two cost ``d / T + T / (2 M)``, ``M`` the mean time between such losses of
the gang, least at ``T = sqrt(2 d M)`` (Young 1974; Daly 2006's higher-order terms matter only when T
nears M, which the ceiling keeps it from). Announced reclaims do not enter: the notice's own checkpoint
keeps their work, where it lands: for a job whose recent notices came to ranks that could not save in
time (the agent's deadline-at-risk on the attempt), those count as losses too (``work_losing_share``).
The controller knows ``M`` (placement's interruption rate of the pool it launched
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


def work_losing_share(unannounced_share: float, notices_at_risk: float) -> float:
    """Share of the gang's losses that redo the work since the last periodic save: the unannounced ones,
    and of the announced ones those whose notice came to ranks that could not save in time
    (``notices_at_risk``: the share of the job's recent noticed gangs whose ranks' last save took
    longer than the notice left; 0 without any). A 2-node gang of a 1.1 TB checkpoint flushes each
    node's half in ~135 s against the 120 s notice: every reclaim of it loses that work."""
    at_risk = min(max(notices_at_risk, 0.0), 1.0)
    return unannounced_share + (1.0 - unannounced_share) * at_risk
