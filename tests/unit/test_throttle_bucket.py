"""The throttle's token bucket, with an injected clock: how long it makes senders wait."""

from __future__ import annotations

import pytest

from spotrelay.local.throttle import TokenBucket


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept = 0.0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept += seconds
        self.now += seconds


def test_a_burst_passes_then_senders_wait_for_the_rate() -> None:
    t = FakeTime()
    bucket = TokenBucket(1000.0, burst=500.0, clock=t.clock, sleep=t.sleep)
    bucket.take(500)
    assert t.slept == 0.0  # within the burst
    for _ in range(10):
        bucket.take(1000)
    # 10 000 bytes past the burst at 1000 bytes/s
    assert t.slept == pytest.approx(10.0)


def test_idle_time_refills_only_up_to_the_burst() -> None:
    t = FakeTime()
    bucket = TokenBucket(100.0, burst=50.0, clock=t.clock, sleep=t.sleep)
    t.now = 1000.0  # a long pause earns no more than the burst
    bucket.take(150)
    assert t.slept == pytest.approx(1.0)


def test_a_rate_of_zero_is_refused() -> None:
    with pytest.raises(ValueError, match="throttle rate"):
        TokenBucket(0)
