"""Pure bookkeeping of pool events: counters and cooldowns.

A pool that just raised InsufficientInstanceCapacity, hit a quota or had an instance reclaimed is
skipped by placement until ``cooldown_until``. Repeated capacity failures back off exponentially
(``capacity_s * escalation ** (streak - 1)``, capped at ``max_s``); a good launch resets the streak.
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
    """One instance got a spot interruption notice (count once per instance)."""
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


def count_event(stats: PoolStats, event: PoolEvent, now: float, hours: float = 0.0) -> PoolStats:
    """The counters after ``event`` (no cooldown change)."""
    update: dict[str, object] = {"last_event": event.value, "last_event_at": now}
    if event is PoolEvent.LAUNCHED:
        update |= {"launches": stats.launches + 1, "failure_streak": 0}
    elif event is PoolEvent.INTERRUPTED:
        update |= {"interruptions": stats.interruptions + 1}
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
    counted = count_event(stats, event, now, hours)
    until = now + cooldown_seconds(counted, event, policy or CooldownPolicy())
    if until > counted.cooldown_until and event not in (PoolEvent.LAUNCHED, PoolEvent.OBSERVED):
        counted = counted.model_copy(update={"cooldown_until": until})
    return counted


def cooling_down(stats: PoolStats | None, now: float) -> bool:
    return stats is not None and now < stats.cooldown_until
