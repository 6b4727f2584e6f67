"""Pool event bookkeeping: counters, escalating cooldowns, the in-memory store."""

from __future__ import annotations

import pytest

from spotrelay.placement import CooldownPolicy, InMemoryPoolStatsStore, PoolEvent, apply_event, empty_stats
from spotrelay.placement.cooldown import cooling_down

T0 = 1_000_000.0
KEY = "us-east-1/us-east-1a/p5.48xlarge/spot"


def test_capacity_failures_back_off_exponentially_and_a_launch_resets_the_streak() -> None:
    policy = CooldownPolicy(capacity_s=600, escalation=2.0, max_s=1800)
    s = empty_stats(KEY)
    waits = []
    for i in range(4):
        s = apply_event(s, PoolEvent.CAPACITY_FAILURE, T0 + i, policy=policy)
        waits.append(s.cooldown_until - (T0 + i))
    assert waits == [600, 1200, 1800, 1800]  # capped
    assert s.capacity_failures == 4 and s.failure_streak == 4
    s = apply_event(s, PoolEvent.LAUNCHED, T0 + 5000, policy=policy)
    assert s.failure_streak == 0 and s.launches == 1
    s = apply_event(s, PoolEvent.CAPACITY_FAILURE, T0 + 6000, policy=policy)
    assert s.cooldown_until == T0 + 6600


def test_a_months_long_failure_streak_stays_at_the_cap() -> None:
    """Seen in the simulator: a review retrying a pool that cannot hold the gang every few hours for
    ten months ran the streak past 1,024 and 2.0 ** streak overflowed (the job crashed)."""
    s = empty_stats(KEY).model_copy(update={"failure_streak": 5000})
    s = apply_event(s, PoolEvent.CAPACITY_FAILURE, T0, policy=CooldownPolicy())
    assert s.cooldown_until == T0 + CooldownPolicy().max_s


def test_interruption_and_quota_cool_down_and_cooldowns_never_shrink() -> None:
    policy = CooldownPolicy(interruption_s=1800, quota_s=3600, capacity_s=60)
    s = apply_event(empty_stats(KEY), PoolEvent.QUOTA_EXCEEDED, T0, policy=policy)
    assert s.cooldown_until == T0 + 3600 and s.quota_failures == 1
    s = apply_event(s, PoolEvent.CAPACITY_FAILURE, T0 + 10, policy=policy)
    assert s.cooldown_until == T0 + 3600  # a shorter cooldown does not cut the longer one
    s = apply_event(s, PoolEvent.INTERRUPTED, T0 + 3000, policy=policy)
    assert s.cooldown_until == T0 + 4800 and s.interruptions == 1
    assert s.last_event == "interrupted" and s.last_event_at == T0 + 3000
    assert cooling_down(s, T0 + 4799) and not cooling_down(s, T0 + 4800) and not cooling_down(None, T0)


def test_a_reclaim_wave_counts_once_and_each_wave_counts() -> None:
    # the notices of instances EC2 takes back together: the gang is interrupted once (placement turns the
    # count into nodes x rate, so counting each instance would multiply the gang's rate by the wave's size)
    policy = CooldownPolicy(interruption_s=1800, wave_s=120)
    s = empty_stats(KEY)
    for t in (T0, T0 + 1, T0 + 5, T0 + 119, T0 - 30):  # the last one arrives late, older than the first
        s = apply_event(s, PoolEvent.INTERRUPTED, t, policy=policy)
    assert s.interruptions == 1 and s.wave_at == T0
    assert s.cooldown_until == T0 + 119 + 1800  # every notice still extends the cooldown
    s = apply_event(s, PoolEvent.INTERRUPTED, T0 + 120, policy=policy)  # the window is over: a new wave
    s = apply_event(s, PoolEvent.INTERRUPTED, T0 + 200, policy=policy)
    assert s.interruptions == 2 and s.wave_at == T0 + 120
    s = apply_event(s, PoolEvent.INTERRUPTED, T0 - 600, policy=policy)  # much older, delivered late: its own
    assert s.interruptions == 3
    every = CooldownPolicy(wave_s=0)  # wave_s 0: every notice counts (the count per instance)
    one = empty_stats(KEY)
    for _ in range(3):
        one = apply_event(one, PoolEvent.INTERRUPTED, T0, policy=every)
    assert one.interruptions == 3


def test_observed_hours_accumulate_without_cooling() -> None:
    s = apply_event(empty_stats(KEY), PoolEvent.OBSERVED, T0, hours=12.5)
    s = apply_event(s, PoolEvent.OBSERVED, T0 + 1, hours=0.5)
    assert s.hours_observed == 13.0 and s.cooldown_until == 0.0
    with pytest.raises(ValueError):
        apply_event(s, PoolEvent.OBSERVED, T0, hours=-1)


def test_in_memory_store_records_and_reads_back() -> None:
    store = InMemoryPoolStatsStore(CooldownPolicy(capacity_s=100))
    store.record(KEY, PoolEvent.CAPACITY_FAILURE, T0)
    store.record("other", PoolEvent.LAUNCHED, T0)
    got = store.get_many([KEY, "never-seen"])
    assert list(got) == [KEY] and got[KEY].cooldown_until == T0 + 100
    assert set(store.all()) == {KEY, "other"}
