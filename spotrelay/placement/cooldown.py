"""Pure bookkeeping of pool events: counters and cooldowns.

A pool that just raised InsufficientInstanceCapacity, hit a quota or had an instance reclaimed is
skipped by placement until ``cooldown_until``. Repeated capacity failures back off exponentially
(``capacity_s * escalation ** (streak - 1)``, capped at ``max_s``); a good launch resets the streak.

Interruptions are counted per reclaim wave, not per instance: EC2 takes capacity back from a pool
several instances at once, and their notices arrive together. Placement turns the count into a gang's
interruptions per hour (``gang_rate = nodes x rate``), so a wave of 32 counted 32 times made a pool
that interrupted a 32-node gang once in six hours look like one that interrupts it three times an
hour. A notice within ``wave_s`` of the one that began the last counted wave is part of it.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from spotrelay.placement.pool_stats import PoolStats


class PoolEvent(StrEnum):
    LAUNCHED = "launched"
    """A whole gang came up in the pool."""
    INTERRUPTED = "interrupted"
    """One instance got a spot interruption notice (counted once per reclaim wave)."""
    CAPACITY_FAILURE = "capacity-failure"
    """InsufficientInstanceCapacity, or a partial fleet we released."""
    QUOTA_EXCEEDED = "quota-exceeded"
    """VcpuLimitExceeded / MaxSpotInstanceCountExceeded."""
    OBSERVED = "observed"
    """Instance-hours run in the pool (``hours``); the denominator of the interruption rate."""


class CooldownPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    capacity_s: float = Field(900.0, ge=0, description="first cooldown after a capacity failure")
    interruption_s: float = Field(1800.0, ge=0, description="after a spot interruption notice")
    quota_s: float = Field(3600.0, ge=0, description="after a quota error (limits rarely move fast)")
    escalation: float = Field(2.0, ge=1.0, description="factor per consecutive capacity failure")
    max_s: float = Field(4 * 3600.0, ge=0)
    wave_s: float = Field(120.0, ge=0, description="notices this close to a counted one are its reclaim wave "
                                                   "(the 2-minute notice window)")


def new_wave(stats: PoolStats, now: float, policy: CooldownPolicy) -> bool:
    """Whether a notice at ``now`` begins a reclaim wave (late notices of a wave arrive out of order too)."""
    return stats.wave_at is None or abs(now - stats.wave_at) >= policy.wave_s


def cooldown_seconds(stats: PoolStats, event: PoolEvent, policy: CooldownPolicy) -> float:
    """How long ``event`` cools the pool, given the stats AFTER counting it."""
    if event is PoolEvent.CAPACITY_FAILURE:
        streak = max(stats.failure_streak, 1)
        # a long streak (a review retrying a full pool for months) must not overflow: the cap holds long before
        return min(policy.capacity_s * policy.escalation ** min(streak - 1, 64), policy.max_s)
    if event is PoolEvent.INTERRUPTED:
        return min(policy.interruption_s, policy.max_s)
    if event is PoolEvent.QUOTA_EXCEEDED:
        return min(policy.quota_s, policy.max_s)
    return 0.0


def count_event(stats: PoolStats, event: PoolEvent, now: float, hours: float = 0.0,
                policy: CooldownPolicy | None = None) -> PoolStats:
    """The counters after ``event`` (no cooldown change)."""
    update: dict[str, object] = {"last_event": event.value, "last_event_at": now}
    if event is PoolEvent.LAUNCHED:
        update |= {"launches": stats.launches + 1, "failure_streak": 0}
    elif event is PoolEvent.INTERRUPTED:
        if new_wave(stats, now, policy or CooldownPolicy()):
            update |= {"interruptions": stats.interruptions + 1, "wave_at": now}
    elif event is PoolEvent.CAPACITY_FAILURE:
        update |= {"capacity_failures": stats.capacity_failures + 1, "failure_streak": stats.failure_streak + 1}
    elif event is PoolEvent.QUOTA_EXCEEDED:
        update |= {"quota_failures": stats.quota_failures + 1}
    elif event is PoolEvent.OBSERVED:
        if hours < 0:
            raise ValueError("hours observed cannot be negative")
        update = {"hours_observed": stats.hours_observed + hours}
    return stats.model_copy(update=update)


def apply_event(
    stats: PoolStats, event: PoolEvent, now: float, hours: float = 0.0, policy: CooldownPolicy | None = None
) -> PoolStats:
    """Count ``event`` and extend (never shorten) the pool's cooldown."""
    policy = policy or CooldownPolicy()
    counted = count_event(stats, event, now, hours, policy)
    until = now + cooldown_seconds(counted, event, policy)
    if until > counted.cooldown_until and event not in (PoolEvent.LAUNCHED, PoolEvent.OBSERVED):
        counted = counted.model_copy(update={"cooldown_until": until})
    return counted


def cooling_down(stats: PoolStats | None, now: float) -> bool:
    return stats is not None and now < stats.cooldown_until
