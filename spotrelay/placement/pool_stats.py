"""What we have seen of each pool: launches, interruptions, capacity failures, exposure, cooldown.

``PoolStats`` is the record; ``PoolStatsStore`` the port (DynamoDB in AWS:
``spotrelay/adapters/dynamodb_pool_stats.py``; in memory for the twin, the simulator and tests).
How an event changes a record is pure and lives in ``cooldown.py``; stores only persist it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field

from spotrelay.placement.cooldown import CooldownPolicy, PoolEvent, apply_event


class PoolStats(BaseModel):
    """Counters for one pool (``Pool.key``). Interruptions and hours are per instance."""

    model_config = ConfigDict(extra="forbid")
    pool_key: str
    launches: int = Field(0, ge=0, description="gangs launched successfully")
    interruptions: int = Field(0, ge=0, description="reclaim waves: spot notices, those of one wave counted once")
    capacity_failures: int = Field(0, ge=0, description="InsufficientInstanceCapacity / partial fleets")
    quota_failures: int = Field(0, ge=0, description="vCPU or spot-count limits hit")
    hours_observed: float = Field(0.0, ge=0, description="instance-hours run in the pool")
    failure_streak: int = Field(0, ge=0, description="capacity failures since the last good launch")
    cooldown_until: float = Field(0.0, description="epoch seconds; the pool is skipped until then")
    last_event: str | None = None
    last_event_at: float = 0.0
    wave_at: float | None = Field(None, description="epoch seconds of the notice that began the last counted wave")

    def cooling(self, now: float) -> bool:
        return now < self.cooldown_until


def empty_stats(pool_key: str) -> PoolStats:
    return PoolStats(pool_key=pool_key)


class PoolStatsStore(Protocol):
    def get_many(self, pool_keys: Iterable[str]) -> dict[str, PoolStats]:
        """Stats for the keys that have any; keys never seen are absent (callers treat them as new)."""

    def all(self) -> dict[str, PoolStats]: ...

    def record(self, pool_key: str, event: PoolEvent, now: float, hours: float = 0.0) -> PoolStats:
        """Count ``event`` atomically, extend the cooldown it calls for, return the new record."""


class InMemoryPoolStatsStore:
    """A dict-backed store for the local twin, the simulator and unit tests."""

    def __init__(self, policy: CooldownPolicy | None = None) -> None:
        self._items: dict[str, PoolStats] = {}
        self._policy = policy or CooldownPolicy()

    def get_many(self, pool_keys: Iterable[str]) -> dict[str, PoolStats]:
        return {k: self._items[k] for k in pool_keys if k in self._items}

    def all(self) -> dict[str, PoolStats]:
        return dict(self._items)

    def record(self, pool_key: str, event: PoolEvent, now: float, hours: float = 0.0) -> PoolStats:
        current = self._items.get(pool_key) or empty_stats(pool_key)
        updated = apply_event(current, event, now, hours=hours, policy=self._policy)
        self._items[pool_key] = updated
        return updated
