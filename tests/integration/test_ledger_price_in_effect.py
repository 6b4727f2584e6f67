"""A closed attempt is counted at the spot price in effect over its life, not its launch price.

AWS bills a spot instance the price in effect while it runs. The ledger used to keep the launch price, and a
placer that launches where spot is cheap now sees it rise more often than fall: on the simulator's synthetic
market the job record said 0.7-5.8% less than the bill, so a budget could be overrun by that much. Every
close (sfn_recover, a move in sfn_provision, sfn_finalize) now asks the pool's price history
(``MarketData.price_history``: DescribeSpotPriceHistory) and counts the attempt at its time-weighted mean;
a history that cannot be read leaves the launch price (the close never fails for it)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from functions import _runtime, sfn_finalize, sfn_provision, sfn_recover
from spotrelay.domain.models import Job, NodeState, Pool
from spotrelay.domain.status import JobStatus
from spotrelay.services.describe import cost_report
from spotrelay.services.savings import on_demand_cost
from tests.integration.controller_doubles import Env, QuotedMarket, ctx, env, running_job

__all__ = ["env"]
TIMINGS = {"backoff_s": 5, "backoff_max_s": 60}
LAUNCH = 25.0  # USD per instance-hour when the gang launched
HOUR = 3600.0


class RefusingMarket(QuotedMarket):
    def price_history(self, pool: Pool, start: float, end: float) -> list[tuple[float, float]]:
        raise RuntimeError("DescribeSpotPriceHistory: throttled")


@pytest.fixture
def market(env: Env) -> Iterator[QuotedMarket]:
    quoted = QuotedMarket()
    _runtime.set_factories(market=lambda: quoted)
    yield quoted


def an_hour_old(env: Env, quoted: QuotedMarket, **job: Any) -> tuple[Job, float]:
    """A 2-node spot job launched an hour ago at LAUNCH; its pool's price was 20 for the first half
    hour and 40 since (a mean of 30 over the hour)."""
    job_, gang = running_job(env.store, env.compute, **job)
    start = time.time() - HOUR
    env.store.update_job(job_.job_id, lambda j: j.model_copy(update={"attempts": [
        j.attempts[0].model_copy(update={"started_at": start, "price_per_hour": LAUNCH})]}))
    quoted.history[gang[0].pool.key] = [(start - 600.0, 20.0), (start + HOUR / 2, 40.0)]
    return env.store.get_job(job_.job_id), start


def rank_1_lost(env: Env, job: Job) -> Job:
    """Rank 1 is lost and sfn_recover closes the attempt: the job after."""
    env.store.update_node(job.job_id, "a1-r1", lambda n: n.model_copy(update={"state": NodeState.LOST}))
    sfn_recover.handler({"job_id": job.job_id, "timings": TIMINGS, "outcome": {"outcome": "node-lost", "attempt": 1}},
                        ctx())
    return env.store.get_job(job.job_id)


def test_recover_counts_the_attempt_at_the_price_in_effect_and_the_report_shows_it(
        env: Env, market: QuotedMarket) -> None:
    job, _ = an_hour_old(env, market)
    closed = rank_1_lost(env, job)
    a = closed.attempts[0]
    assert a.price_per_hour == LAUNCH and a.price_in_effect == pytest.approx(30.0, rel=1e-3)
    assert a.cost == pytest.approx(2 * a.price_in_effect * (a.ended_at - a.started_at) / HOUR)  # not at 25
    assert closed.cost_so_far == a.cost
    line = cost_report(closed, time.time()).lines[0]
    assert line.price_per_hour == a.price_in_effect and line.cost == pytest.approx(a.cost, abs=1e-4)
    # the same instance-hours at on-demand: cost / the price it was counted at x the on-demand price
    od = on_demand_cost(a, a.cost)
    assert od is not None and od == pytest.approx(2 * (a.ended_at - a.started_at) / HOUR * 55.04, rel=1e-3)


def test_a_history_that_cannot_be_read_leaves_the_launch_price_and_the_loss_is_recorded(env: Env) -> None:
    refusing = RefusingMarket()
    _runtime.set_factories(market=lambda: refusing)
    job, _ = an_hour_old(env, refusing)
    closed = rank_1_lost(env, job)
    a = closed.attempts[0]
    assert closed.status is JobStatus.RECOVERING and a.end_reason == "node-lost"
    assert a.price_in_effect is None and a.cost == pytest.approx(2 * LAUNCH * (a.ended_at - a.started_at) / HOUR)


def test_a_move_closes_the_old_attempt_at_the_price_in_effect(env: Env, market: QuotedMarket) -> None:
    job, _ = an_hour_old(env, market)
    env.store.update_node(job.job_id, "a1-r0", lambda n: n.model_copy(update={"state": NodeState.RUNNING}))
    env.store.update_node(job.job_id, "a1-r1", lambda n: n.model_copy(update={"state": NodeState.RUNNING}))
    target = Pool(region="us-east-1", az="us-east-1a", instance_type="p4d.24xlarge", market="spot")
    move = {"outcome": "migrate", "attempt": 1, "reason": "cheaper", "lost_ranks": [0, 1],
            "target": {"pool": target.model_dump(), "price_per_hour": 12.0, "score": 1.0, "nodes": 2}}
    assert sfn_provision.handler({"job_id": job.job_id, "move": move}, ctx())["attempt"] == 2
    moved = env.store.get_job(job.job_id)
    old, new = moved.attempts
    assert old.end_reason == "migrate" and old.price_in_effect == pytest.approx(30.0, rel=1e-3)
    assert old.cost == pytest.approx(2 * old.price_in_effect * (old.ended_at - old.started_at) / HOUR)
    assert new.ended_at is None and new.price_in_effect is None  # open: at its launch price until it closes


def test_finalize_counts_the_last_attempt_at_the_price_in_effect(env: Env, market: QuotedMarket) -> None:
    job, _ = an_hour_old(env, market)
    assert sfn_finalize.handler({"job_id": job.job_id, "result": "SUCCEEDED"}, ctx())["changed"] is True
    final = env.store.get_job(job.job_id)
    a = final.attempts[0]
    assert a.end_reason == "succeeded" and a.price_in_effect == pytest.approx(30.0, rel=1e-3)
    assert final.cost_so_far == a.cost == pytest.approx(2 * a.price_in_effect * (a.ended_at - a.started_at) / HOUR)


def test_an_on_demand_attempt_keeps_its_price(env: Env, market: QuotedMarket) -> None:
    job, _ = an_hour_old(env, market, market="on-demand")
    market.history.clear()
    sfn_finalize.handler({"job_id": job.job_id, "result": "SUCCEEDED"}, ctx())
    a = env.store.get_job(job.job_id).attempts[0]
    assert a.price_in_effect is None and a.cost == pytest.approx(2 * LAUNCH * (a.ended_at - a.started_at) / HOUR)


class CountingMarket(QuotedMarket):
    def __init__(self) -> None:
        super().__init__()
        self.asked: list[str] = []

    def price_history(self, pool: Pool, start: float, end: float) -> list[tuple[float, float]]:
        self.asked.append(pool.key)
        return super().price_history(pool, start, end)


def sweep(env: Env, market: QuotedMarket, now: float) -> dict[str, Any]:
    from spotrelay.placement import InMemoryPoolStatsStore
    from spotrelay.services.controller import Controller
    from spotrelay.services.reconcile import reconcile

    ctl = Controller(store=env.store, workflow=env.workflow, compute=env.compute, market=market,
                     pool_stats=InMemoryPoolStatsStore())
    return reconcile(ctl, now, stale_after_s=10 * HOUR)  # (no heartbeats here: none goes stale)


def two_hours_at_20_then_40(env: Env, market: QuotedMarket, **spec: Any) -> tuple[Job, str, float]:
    """A running 2-node spot job launched two hours before ``now`` at $20 (the job, its pool's key,
    ``now``); its pool's price doubled half an hour in: $35 on average over the two hours. ``spec``:
    sections added to the job's spec."""
    job, gang = running_job(env.store, env.compute, tokens={"outcome": "tok-out"})
    assert job.execution_arn is not None
    env.workflow.executions[job.execution_arn] = "RUNNING"
    now = time.time()
    start = now - 2 * HOUR
    key = gang[0].pool.key
    market.history[key] = [(start - 60.0, 20.0), (start + HOUR / 2, 40.0)]
    env.store.update_job(job.job_id, lambda j: j.model_copy(update={
        "spec": {**j.spec, **spec},
        "attempts": [j.attempts[0].model_copy(update={"started_at": start, "price_per_hour": 20.0})]}))
    return env.store.get_job(job.job_id), key, now


def test_the_sweep_reads_a_budgeted_jobs_open_attempt_price_hourly_and_stops_it_at_that_price(env: Env) -> None:
    """The reconcile sweep counts the open attempt's clock at the spot price in effect for a job with a
    budget, read once an hour (DescribeSpotPriceHistory's rate limit is shared by every job): here the
    price doubled half an hour into the attempt, and the budget that the launch price would leave for
    hours more is spent now."""
    market = CountingMarket()
    job, key, now = two_hours_at_20_then_40(env, market, budget={"max_total_cost": 150.0})
    # at the launch price: 2 nodes x $20 x 2 h = $80 of $150; at the price in effect: $140, and a sweep
    # and a save (3 min at $70/h: $3.50) ahead it passes $140: still within. Ten minutes on, it stops.
    assert sweep(env, market, now)["over_budget"] == []
    a = env.store.get_job(job.job_id).attempts[0]
    assert market.asked == [key] and a.price_checked_at == now and a.price_in_effect == pytest.approx(35.0)
    assert sweep(env, market, now + 60)["over_budget"] == [] and market.asked == [key]  # not again within the hour
    # (the launch price says $84.00 by then: no stop; the price in effect read at `now` says $147)
    assert sweep(env, market, now + 360)["over_budget"] == [job.job_id] and market.asked == [key]
    assert env.store.get_job(job.job_id).reasons[-1].startswith("budget: spent $14")


def test_a_job_without_a_budget_is_read_hourly_too_and_its_cost_shows_the_price_in_effect(env: Env) -> None:
    """What ``spotrelay cost`` shows of a running attempt follows the bill with a budget or without:
    the sweep reads every open spot attempt's price in effect hourly (until 5 December only a budgeted
    job's, so a budget-less job's running attempt stayed at its launch price until it closed)."""
    market = CountingMarket()
    job, key, now = two_hours_at_20_then_40(env, market)
    assert not (job.spec or {}).get("budget")
    sweep(env, market, now)
    read = env.store.get_job(job.job_id)
    a = read.attempts[0]
    assert market.asked == [key] and a.price_checked_at == now and a.price_in_effect == pytest.approx(35.0)
    line = cost_report(read, now).lines[0]  # the running attempt at 35, not its launch price 20
    assert line.price_per_hour == pytest.approx(35.0) and line.cost == pytest.approx(2 * 35.0 * 2, rel=1e-6)
    sweep(env, market, now + 600)
    assert market.asked == [key]  # (not asked again within the hour)
    sweep(env, market, now + HOUR)
    assert market.asked == [key, key]


def test_a_failed_read_keeps_the_launch_price_and_waits_an_hour(env: Env) -> None:
    market = CountingMarket()
    job, _ = running_job(env.store, env.compute, tokens={"outcome": "tok-out"})
    assert job.execution_arn is not None
    env.workflow.executions[job.execution_arn] = "RUNNING"
    now = time.time()
    env.store.update_job(job.job_id, lambda j: j.model_copy(update={
        "attempts": [j.attempts[0].model_copy(update={"started_at": now - 2 * HOUR})]}))
    sweep(env, RefusingMarket(), now)  # the read fails: the launch price stands, and the sweep goes on
    a = env.store.get_job(job.job_id).attempts[0]
    assert a.price_checked_at == now and a.price_in_effect is None
    sweep(env, market, now + 600)
    assert market.asked == []  # (not asked again within the hour)


def test_a_write_that_keeps_conflicting_leaves_the_price_for_the_next_sweep_and_the_sweep_goes_on(env: Env) -> None:
    """The reconcile sweeps every job: one whose record is busy (every write conflicts) keeps its price
    unread this sweep (the next one reads it), and the read answers the job as it was instead of
    raising, so the sweep goes on to its checks and the other jobs."""
    from spotrelay.errors import ConflictError
    from spotrelay.services import budget

    market = CountingMarket()
    job, _ = running_job(env.store, env.compute, tokens={"outcome": "tok-out"})
    now = time.time()
    env.store.update_job(job.job_id, lambda j: j.model_copy(update={
        "spec": {**j.spec, "budget": {"max_total_cost": 10_000.0}},
        "attempts": [j.attempts[0].model_copy(update={"started_at": now - 2 * HOUR})]}))
    busy = env.store.get_job(job.job_id)

    class BusyStore:
        def __getattr__(self, name: str) -> Any:
            return getattr(env.store, name)

        def update_job(self, *args: Any, **kwargs: Any) -> Any:
            raise ConflictError("the record changed three times")

    from spotrelay.services.controller import Controller

    ctl = Controller(store=BusyStore(), market=market)  # type: ignore[arg-type]
    assert budget.refresh_price(ctl, busy, now) is busy and market.asked == [busy.attempts[0].pool.key]
    assert env.store.get_job(job.job_id).attempts[0].price_checked_at is None  # read again next sweep
