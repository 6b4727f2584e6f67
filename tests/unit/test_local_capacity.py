"""The twin's capacity errors (spotrelay/local/market.py): a counted rule is used up by the launches it
refuses; an outage (the chaos campaign's ``capacity`` fault) refuses every launch until its end, however
often the controller tries, and then lets them through."""

from __future__ import annotations

import time

import pytest

from spotrelay.domain.models import Pool
from spotrelay.errors import InsufficientCapacityError
from spotrelay.local.market import CapacityRule, MarketModel

SPOT = Pool(region="us-east-1", az="us-east-1a", instance_type="p5.48xlarge", market="spot")
OTHER = Pool(region="us-west-2", az="us-west-2b", instance_type="p4d.24xlarge", market="on-demand")


def _refused(market: MarketModel, pool: Pool) -> bool:
    try:
        market.check_capacity(pool)
    except InsufficientCapacityError:
        return True
    return False


def test_a_counted_rule_refuses_its_launches_then_is_used_up() -> None:
    market = MarketModel(capacity=[CapacityRule("us-east-1/*/p5.48xlarge/spot", times=2)])
    assert not _refused(market, OTHER)  # another pool: not counted
    assert [_refused(market, SPOT) for _ in range(3)] == [True, True, False]


def test_an_outage_refuses_every_launch_until_its_end_and_no_longer(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    market = MarketModel(capacity=[CapacityRule("*", until=1030.0)])
    # however many launches are tried, the outage is not used up by refusing them
    assert all(_refused(market, pool) for _ in range(50) for pool in (SPOT, OTHER))
    clock[0] = 1029.9
    assert _refused(market, SPOT)
    clock[0] = 1030.0
    assert not _refused(market, SPOT) and not _refused(market, OTHER)


def test_outages_that_overlap_end_with_the_last_one(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    market = MarketModel(capacity=[CapacityRule("*", until=20.0), CapacityRule("*", until=35.0)])
    clock[0] = 25.0
    assert _refused(market, SPOT)
    clock[0] = 35.0
    assert not _refused(market, SPOT)
