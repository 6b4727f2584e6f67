"""The cost ledger: per-attempt cost, cost so far, the on-demand line, the budget."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spotrelay.domain.cost import (
    LEAVE_TO_EC2_MARGIN_S,
    PRICE_REFRESH_S,
    CostEntry,
    CostLedger,
    attempt_cost,
    budget_reached_at,
    budget_stop,
    charge_outlived,
    check_budget,
    closed_attempt,
    drains,
    interruption_is_free,
    leave_to_ec2,
    mean_price,
    outlived_cost,
    price_due,
    spent_at,
    unbilled_node_seconds,
)
from spotrelay.domain.models import Attempt, Pool
from spotrelay.errors import BudgetExceededError

T0 = 1_800_000_000.0
P5 = Pool(region="us-east-1", az="us-east-1a", instance_type="p5.48xlarge", market="spot")


def entry(attempt: int, nodes: int, start: float, end: float | None = None, price: float = 22.0) -> CostEntry:
    return CostEntry(attempt=attempt, pool=P5, nodes=nodes, price_per_hour=price, on_demand_price_per_hour=55.0,
                     started_at=start, ended_at=end)


def test_attempt_cost_is_price_times_nodes_times_hours() -> None:
    assert attempt_cost(22.0, 4, T0, T0 + 1800) == pytest.approx(44.0)
    assert attempt_cost(22.0, 4, T0, T0 - 5) == 0.0
    with pytest.raises(ValueError):
        attempt_cost(-1.0, 1, T0, T0 + 1)


def test_a_closed_attempt_stops_its_clock_with_its_cost() -> None:
    """The one close the services (workflow_tasks._close_attempt) and the simulator (sim/attempts.close) use."""
    open_ = Attempt(number=2, started_at=1000.0, price_per_hour=30.0, nodes=2, saved_step=40)
    closed = closed_attempt(open_, 1000.0 + 1800, "interrupted")
    assert (closed.ended_at, closed.end_reason, closed.cost) == (2800.0, "interrupted", pytest.approx(30.0))
    assert closed.saved_step == 40 and open_.ended_at is None  # the rest kept; the given one unchanged
    assert closed_attempt(Attempt(number=1, price_per_hour=30.0, nodes=2), 50.0).cost == 0.0  # never started


def test_ledger_sums_attempts_and_replacements_and_keeps_the_clock_running() -> None:
    ledger = CostLedger().opened(entry(1, 4, T0))
    ledger = ledger.closed(T0 + 3600)  # attempt 1: 4 nodes for an hour = 88
    ledger = ledger.opened(entry(2, 4, T0 + 4000))
    # replace-lost-nodes in attempt 3: attempt 2's survivors keep running, one new node joins
    ledger = ledger.closed(T0 + 7600, attempt=2).opened(entry(2, 3, T0 + 7600)).opened(entry(3, 1, T0 + 7600))
    now = T0 + 7600 + 1800
    assert ledger.attempt_cost(1, now) == pytest.approx(88.0)
    assert ledger.attempt_cost(2, now) == pytest.approx(88.0 + 3 * 11.0)
    assert ledger.attempt_cost(3, now) == pytest.approx(11.0)
    assert ledger.cost_so_far(now) == pytest.approx(88.0 + 88.0 + 33.0 + 11.0)
    assert ledger.on_demand_equivalent(now) == pytest.approx(220.0 * 55.0 / 22.0)
    saved, fraction = ledger.savings(now)
    assert fraction == pytest.approx(0.6) and saved == pytest.approx(550.0 - 220.0)
    assert "saved $330.00 = 60%" in ledger.summary(now)


def test_budget_check() -> None:
    ledger = CostLedger().opened(entry(1, 2, T0))
    ledger.check_budget(None, T0 + 10 * 3600)
    ledger.check_budget(100.0, T0 + 3600)  # 44 spent
    with pytest.raises(BudgetExceededError, match=r"spent \$132.00 of the \$100.00 budget"):
        ledger.check_budget(100.0, T0 + 3 * 3600)
    with pytest.raises(BudgetExceededError):
        check_budget(100.0, 100.0)
    assert CostLedger().savings(T0) == (0.0, 0.0)


def test_ec2s_interruption_in_a_spot_instances_first_hour_is_free_and_such_an_instance_is_left_to_ec2() -> None:
    assert interruption_is_free("spot", 1000.0, 1000.0 + 3599.0)
    assert not interruption_is_free("spot", 1000.0, 1000.0 + 3600.0)  # past the first hour: per second
    assert not interruption_is_free("on-demand", 1000.0, 1001.0)
    # terminating it ourselves would bill the first hour so far: leave it, with a margin for EC2's timing
    assert leave_to_ec2("spot", 0.0, 3600.0 - LEAVE_TO_EC2_MARGIN_S - 1)
    assert not leave_to_ec2("spot", 0.0, 3600.0 - LEAVE_TO_EC2_MARGIN_S)
    assert not leave_to_ec2("spot", 0.0, None)  # no notice from EC2 (a move's or a health check's doom)
    assert not leave_to_ec2("on-demand", 0.0, 60.0)


def test_a_node_a_move_doomed_keeps_its_deadline_and_learns_ec2s_reclaim() -> None:
    from spotrelay.domain.models import Node, NodeState
    from spotrelay.services.interruptions import _doomed

    node = Node(job_id="j", node_id="a1-r0", attempt=1, rank=0, instance_id="i-1", pool=P5, launched_at=T0)
    first = _doomed(node, T0 + 600.0)
    assert first is not None and first.state is NodeState.DOOMED
    assert first.reclaim_at == first.ec2_reclaim_at == T0 + 600
    moving = node.model_copy(update={"state": NodeState.DOOMED, "reclaim_at": T0 + 300.0})  # a move's deadline
    learned = _doomed(moving, T0 + 600.0)
    assert learned is not None and learned.reclaim_at == T0 + 300 and learned.ec2_reclaim_at == T0 + 600
    assert _doomed(learned, T0 + 700.0) is None  # the first notice's reclaim stays
    assert _doomed(node.model_copy(update={"state": NodeState.TERMINATED}), T0 + 600.0) is None


def test_an_attempt_closes_without_the_first_hour_of_the_instances_ec2_noticed() -> None:
    a = Attempt(number=1, pool=P5, started_at=T0, price_per_hour=22.0, nodes=4)
    assert closed_attempt(a, T0 + 1800).cost == pytest.approx(22.0 * 4 * 0.5)
    # one node noticed 30 min in (EC2 takes it in its first hour): 3 nodes' half hour billed
    one = closed_attempt(a, T0 + 1800, noticed=[(T0, T0 + 1800 + 120)])
    assert one.cost == pytest.approx(22.0 * 3 * 0.5)
    assert one.unbilled == pytest.approx(22.0 * 0.5) and closed_attempt(a, T0 + 1800).unbilled == 0.0  # kept apart
    # a node launched before the attempt (a survivor): only this attempt's share is taken off
    assert unbilled_node_seconds(a, T0 + 1800, [(T0 - 600, T0 + 1900)]) == pytest.approx(1800)
    # a reclaim in the hour's last minute: we terminate it on release (billed), so it is counted
    assert unbilled_node_seconds(a, T0 + 1800, [(T0 - 1800 + 30, T0 + 1800)]) == 0.0
    # past its first hour EC2 bills every second: nothing taken off; on-demand is never free
    assert closed_attempt(a, T0 + 1800, noticed=[(T0 - 3000, T0 + 1900)]).cost == pytest.approx(22.0 * 4 * 0.5)
    od = a.model_copy(update={"pool": P5.model_copy(update={"market": "on-demand"})})
    assert closed_attempt(od, T0 + 1800, noticed=[(T0, T0 + 1900)]).cost == pytest.approx(22.0 * 4 * 0.5)


def test_an_instance_that_outlives_its_attempts_close_is_charged_from_the_close_to_its_release() -> None:
    """A rank left to finish its save (a notice's, a move's) runs on after the workflow closed its attempt:
    AWS bills it until it is terminated, so its release charges that time, to its own attempt."""
    closed = closed_attempt(Attempt(number=3, pool=P5, started_at=T0, price_per_hour=36.0, nodes=4), T0 + 3600, "x")
    running = Attempt(number=4, pool=P5, started_at=T0 + 3600, price_per_hour=30.0, nodes=4)
    assert outlived_cost(closed, T0, T0 + 3600 + 100) == pytest.approx(1.0)  # 36 $/h x 100 s
    assert outlived_cost(running, T0, T0 + 9000) == 0.0  # its own clock still runs
    assert outlived_cost(closed, T0 + 3650, T0 + 3700) == pytest.approx(0.5)  # (launched after the close)
    attempts, added = charge_outlived([closed, running], [(3, T0), (3, T0), (4, T0 + 3600), (9, T0)], T0 + 3700)
    assert added == pytest.approx(2.0)  # two of attempt 3's for 100 s each; the open one and an unknown: none
    assert attempts[0].drain_cost == pytest.approx(2.0) and attempts[0].cost == closed.cost
    assert attempts[1] is running
    again, more = charge_outlived(attempts, [(3, T0)], T0 + 3700 + 36)
    assert more == pytest.approx(0.36 + 1.0) and again[0].drain_cost == pytest.approx(3.36)


def test_the_budget_counts_a_closed_attempts_ranks_still_saving_before_their_release_charges_them() -> None:
    current = Attempt(number=2, pool=P5, started_at=T0, price_per_hour=36.0, nodes=1)
    closed = closed_attempt(Attempt(number=1, pool=P5, started_at=T0 - 3600, price_per_hour=36.0, nodes=8), T0)
    accrued, rate = drains([closed, current], [(1, T0 - 3600)] * 8 + [(2, T0)], T0 + 60)
    assert accrued == pytest.approx(8 * 36.0 * 60 / 3600) and rate == pytest.approx(8 * 36.0 / 3600)
    spent = closed.cost  # 288: the record's cost_so_far; the open attempt adds $0.60 a minute
    lead = 120.0
    limit = spent + 36.0 * (60 + lead) / 3600 + 1.0  # a sweep and a save ahead: the open attempt alone fits
    assert budget_stop(spent, current, T0 + 60, limit, lead) is None
    reason = budget_stop(spent, current, T0 + 60, limit, lead, (accrued, rate))  # the drains do not fit
    assert reason is not None and reason.startswith(f"spent ${spent + 0.6 + accrued:,.2f} of the")


def test_the_on_demand_comparison_prices_the_billed_instance_hours_at_the_catalogs_on_demand_price() -> None:
    from spotrelay.placement import catalog
    from spotrelay.services.savings import on_demand_cost

    spot = Pool(region="us-east-1", az="us-east-1a", instance_type="p5.48xlarge", market="spot")
    od = catalog.on_demand_price("us-east-1", "p5.48xlarge")
    assert od is not None
    ran = Attempt(number=1, pool=spot, nodes=2, price_per_hour=22.0, started_at=0.0, ended_at=3600.0, cost=44.0)
    assert on_demand_cost(ran, 44.0) == pytest.approx(2 * od)  # 2 instance-hours billed
    on_demand = ran.model_copy(update={"pool": spot.model_copy(update={"market": "on-demand"}), "price_per_hour": od})
    assert on_demand_cost(on_demand, 2 * od) == 2 * od  # itself
    elsewhere = ran.model_copy(update={"pool": spot.model_copy(update={"region": "ap-south-1", "az": "ap-south-1a"})})
    assert on_demand_cost(elsewhere, 44.0) is None  # no price known: no comparison, not a guess
    assert on_demand_cost(ran.model_copy(update={"pool": None}), 0.0) == 0.0  # never launched: nothing used


def test_the_price_in_effect_is_the_time_weighted_mean_of_the_history() -> None:
    """AWS bills the spot price in effect: 20 for the first half hour, 40 after is 30 over the hour;
    the change in effect at the start counts from the start, changes after the end do not count."""
    history = [(T0 + 1800, 40.0), (T0 - 600, 20.0), (T0 + 7200, 99.0)]  # (any order: sorted)
    assert mean_price(history, T0, T0 + 3600, 25.0) == pytest.approx(30.0)
    assert mean_price(history, T0, T0, 25.0) == 20.0  # one instant: the price then
    assert mean_price([(T0 + 1800, 40.0)], T0, T0 + 3600, 20.0) == pytest.approx(30.0)  # before it: the launch price
    assert mean_price([], T0, T0 + 3600, 25.0) == 25.0
    assert mean_price([(T0 - 1, 31.4159)], T0, T0 + 3600, 25.0) == 31.4159  # no change inside: exactly it
    assert mean_price([(T0 - 1, -1.0), (T0 + 1, math.nan)], T0, T0 + 3600, 25.0) == 25.0  # not prices: skipped


@given(st.lists(st.tuples(st.floats(0, 10_000), st.floats(0, 1000)), max_size=12),
       st.floats(0, 10_000), st.floats(0, 10_000), st.floats(0, 1000))
def test_the_price_in_effect_lies_between_the_prices_in_effect(history: list[tuple[float, float]], start: float,
                                                              length: float, fallback: float) -> None:
    got = mean_price(history, start, start + length, fallback)
    before = [p for t, p in sorted(history) if t <= start]
    seen = [before[-1] if before else fallback] + [p for t, p in history if start < t < start + length]
    assert min(seen) - 1e-9 * max(seen) <= got <= max(seen) + 1e-9 * max(seen)


def test_a_closed_attempt_counted_at_its_price_in_effect_bills_its_drains_at_it_too() -> None:
    a = Attempt(number=1, pool=P5, price_per_hour=20.0, nodes=2, started_at=T0)
    closed = closed_attempt(a, T0 + 3600, "interrupted", [(T0, T0 + 1800)], price=30.0)
    # 2 nodes x 1 h at 30, less the noticed instance's hour EC2 does not bill (left to its reclaim)
    assert closed.price_in_effect == 30.0 and closed.billed_price() == 30.0 and closed.price_per_hour == 20.0
    assert closed.cost == pytest.approx(30.0) and closed.unbilled == pytest.approx(30.0)
    assert outlived_cost(closed, T0, T0 + 3600 + 60) == pytest.approx(30.0 / 60)  # a rank saving a minute past it
    assert drains([closed], [(1, T0)], T0 + 3600 + 60) == pytest.approx((30.0 / 60, 30.0 / 3600))
    assert closed_attempt(a, T0 + 3600).billed_price() == 20.0  # no history: the launch price


def test_a_running_attempts_price_in_effect_is_read_hourly_and_its_clock_counts_at_it() -> None:
    a = Attempt(number=1, pool=P5, price_per_hour=20.0, nodes=2, started_at=T0)
    assert not price_due(a, T0 + PRICE_REFRESH_S - 1) and price_due(a, T0 + PRICE_REFRESH_S)
    assert spent_at(100.0, a, T0 + 3600) == pytest.approx(140.0)  # at launch until read
    read = a.model_copy(update={"price_in_effect": 30.0, "price_checked_at": T0 + 3600})
    assert not price_due(read, T0 + 7199) and price_due(read, T0 + 7200)
    assert spent_at(100.0, read, T0 + 3600) == pytest.approx(160.0)
    assert budget_reached_at(100.0, read, 220.0) == pytest.approx(T0 + 7200)  # $60 an hour from $100
    # its close reads the whole life again; one that cannot keeps the last read, not the launch price
    assert closed_attempt(read, T0 + 7200, price=35.0).cost == pytest.approx(140.0)
    kept = closed_attempt(read, T0 + 7200)
    assert kept.price_in_effect == 30.0 and kept.cost == pytest.approx(120.0)
    on_demand = a.model_copy(update={"pool": P5.model_copy(update={"market": "on-demand"})})
    assert not price_due(on_demand, T0 + 10 * PRICE_REFRESH_S)  # (its price does not move)
    assert not price_due(closed_attempt(a, T0 + 60), T0 + 10 * PRICE_REFRESH_S)
