"""PoolStats on DynamoDB (moto): same results as the pure bookkeeping, atomic under concurrency."""

from __future__ import annotations

from spotrelay.adapters.dynamodb_pool_stats import DynamoDBPoolStatsStore
from spotrelay.placement import CooldownPolicy, InMemoryPoolStatsStore, PoolEvent

KEY = "us-east-1/us-east-1a/p5.48xlarge/spot"
T0 = 1_800_000_000.0
POLICY = CooldownPolicy(capacity_s=600, interruption_s=1800, quota_s=3600)


def test_records_match_the_pure_bookkeeping(aws: dict[str, str]) -> None:
    ddb, mem = DynamoDBPoolStatsStore(policy=POLICY), InMemoryPoolStatsStore(POLICY)
    script = [
        (PoolEvent.CAPACITY_FAILURE, T0, 0.0), (PoolEvent.CAPACITY_FAILURE, T0 + 10, 0.0),
        (PoolEvent.LAUNCHED, T0 + 2000, 0.0), (PoolEvent.OBSERVED, T0 + 9000, 12.5),
        (PoolEvent.INTERRUPTED, T0 + 9000, 0.0), (PoolEvent.QUOTA_EXCEEDED, T0 + 9100, 0.0),
        (PoolEvent.CAPACITY_FAILURE, T0 + 9200, 0.0),  # shorter than the quota cooldown: no change
        # a wave: its notices (one late, older than the counted one) count once; the next wave counts
        (PoolEvent.INTERRUPTED, T0 + 9030, 0.0), (PoolEvent.INTERRUPTED, T0 + 8950, 0.0),
        (PoolEvent.INTERRUPTED, T0 + 9400, 0.0),
    ]
    for event, now, hours in script:
        got, want = ddb.record(KEY, event, now, hours), mem.record(KEY, event, now, hours)
        assert got == want, event
    stored = ddb.get_many([KEY, "us-west-2/us-west-2a/p4d.24xlarge/spot"])
    assert list(stored) == [KEY] and stored[KEY] == mem.all()[KEY]
    assert stored[KEY].cooldown_until == T0 + 9100 + 3600  # the quota's outlasts every notice's
    assert stored[KEY].hours_observed == 12.5 and stored[KEY].failure_streak == 1
    assert stored[KEY].interruptions == 2 and stored[KEY].wave_at == T0 + 9400
    assert ddb.all() == {KEY: stored[KEY]}


def test_a_wave_of_notices_counts_once_and_the_latest_cooldown_wins(aws: dict[str, str]) -> None:
    # Newest first: an older notice arriving late must not shorten the cooldown, nor count again.
    # (Run in sequence: moto's server does not serialize concurrent UpdateItem calls on one item as
    # DynamoDB does; the conditional update is what makes one notice of a wave win it there.)
    store = DynamoDBPoolStatsStore(policy=POLICY)
    times = [T0 + i for i in range(12)]  # twelve instances of one gang reclaimed together
    for t in reversed(times):
        store.record(KEY, PoolEvent.INTERRUPTED, t)
    stats = store.get_many([KEY])[KEY]
    assert stats.interruptions == 1 and stats.last_event == "interrupted"
    assert stats.cooldown_until == max(times) + 1800
    for i in range(1, 4):  # then reclaims five minutes apart: each its own wave
        store.record(KEY, PoolEvent.INTERRUPTED, T0 + 300 * i)
    assert store.get_many([KEY])[KEY].interruptions == 4
