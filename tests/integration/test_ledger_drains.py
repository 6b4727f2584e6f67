"""The ledger charges what an instance is billed after the workflow closed its attempt.

recover and a move close an attempt when the workflow moves on, but AWS bills each instance until it is
terminated: a rank left to finish its notice's or move's save runs on to its exit, and a survivor kept for
the next gang is billed through the replacements' backoff and placement. On the g4dn trace at 16 nodes the
ledger said 4% less than the simulated bill; a budget is a cap only on what the ledger sees. Each such
instance is now charged to its closed attempt's ``drain_cost`` (and the job's ``cost_so_far``), once: at
its release, or when it joins the next attempt; the reconcile's budget counts those still draining."""

from __future__ import annotations

import pytest

from spotrelay.contracts.events import TrainingExited
from spotrelay.contracts.recovery import AttemptEnd, Verdict
from spotrelay.contracts.workflow import WorkflowTimings
from spotrelay.domain.models import NodeState
from spotrelay.errors import BudgetExceededError
from spotrelay.services import budget
from spotrelay.services.describe import cost_report, describe_job
from spotrelay.services.node_events import handle_agent_event
from spotrelay.services.plan import plan
from spotrelay.services.reconcile import reconcile
from spotrelay.services.recovery_flow import DRAIN_GRACE_S, recover
from spotrelay.services.workflow_tasks import provision
from tests.integration.controller_doubles import QuotedMarket
from tests.integration.test_steps_lost import JOB, Gangs, _ids

PRICE_S = 30.0 / 3600.0  # the test gangs' price per instance-second


def test_ranks_draining_a_notices_save_are_charged_from_the_attempts_close_to_their_exit_once() -> None:
    g = Gangs()
    first = g.start(1)
    g.lose(first[1], 1, deadline=g.now + 120)  # launch_at_notice: attempt 1 closes now, both ranks drain
    provision(g.ctl, JOB, plan(g.ctl, JOB, g.now), g.now)  # the replacements launch while the ranks save
    closed = g.job()
    assert closed.attempt == 2 and closed.attempts[0].ended_at == g.now and closed.cost_so_far == 0.0
    assert budget.draining(g.ctl, closed, g.now + 60) == pytest.approx((2 * 60 * PRICE_S, 2 * PRICE_S))

    for node in first:
        exit_ = TrainingExited(**_ids(node), exit_code=75, reason="saved", last_step=40)  # type: ignore[arg-type]
        handle_agent_event(g.ctl, exit_, g.now + 100)
        handle_agent_event(g.ctl, exit_, g.now + 100)  # redelivered: charged once
    job = g.job()
    assert job.attempts[0].drain_cost == pytest.approx(2 * 100 * PRICE_S)
    assert job.cost_so_far == pytest.approx(2 * 100 * PRICE_S)
    assert {n.instance_id for n in first} <= set(g.compute.terminated)
    assert budget.draining(g.ctl, job, g.now + 200) == (0.0, 0.0)  # released: in the ledger now


def test_the_cost_report_counts_the_ranks_still_draining_as_the_budget_does_and_their_release_keeps_it() -> None:
    """describe / cost / jobs while the notice's ranks save: their node-seconds since the close show on
    the closed attempt's line and in the total (the figure the budget sweep counts); once their exit
    charges them the report reads the same from the ledger alone."""
    g = Gangs()
    first = g.start(1)
    g.lose(first[1], 1, deadline=g.now + 120)
    provision(g.ctl, JOB, plan(g.ctl, JOB, g.now), g.now)
    job, nodes = g.job(), g.store.nodes_of(JOB)
    during = cost_report(job, g.now + 60, nodes)
    closed = during.lines[0]
    assert closed.draining == 2 and closed.cost == pytest.approx(2 * 60 * PRICE_S, abs=1e-4)
    assert during.total == pytest.approx(cost_report(job, g.now + 60).total + 2 * 60 * PRICE_S, abs=1e-4)
    swept = budget._spent(job, g.now + 60) + budget.draining(g.ctl, job, g.now + 60)[0]  # the sweep's figure
    assert during.total == pytest.approx(swept, abs=1e-4)
    assert describe_job(job, nodes, g.now + 60).attempts[0].cost == closed.cost

    for node in first:
        handle_agent_event(g.ctl, TrainingExited(**_ids(node), exit_code=75, reason="saved",  # type: ignore[arg-type]
                                                 last_step=40), g.now + 100)
    job, nodes = g.job(), g.store.nodes_of(JOB)
    after = cost_report(job, g.now + 100, nodes)
    assert after.lines[0].draining == 0 and after.lines[0].cost == pytest.approx(2 * 100 * PRICE_S, abs=1e-4)
    assert after.total == cost_report(job, g.now + 100).total  # in the ledger: counted once


def test_a_survivor_kept_through_the_replacements_placement_is_charged_when_it_joins_the_next_attempt() -> None:
    g = Gangs()
    g.store.update_job(JOB, lambda j: j.model_copy(update={"spec": {
        **j.spec, "recovery": {**j.spec["recovery"], "strategy": "replace-lost-nodes"}}}))
    first = g.start(1)
    g.store.update_node(JOB, first[1].node_id, lambda n: n.model_copy(update={"state": NodeState.LOST}))
    kept = recover(g.ctl, JOB, AttemptEnd(outcome=Verdict.NODE_LOST, attempt=1, reason="test", lost_ranks=(1,)),
                   WorkflowTimings(), g.now)
    assert kept.keep_instance_ids == [first[0].instance_id]
    later = g.now + 600  # the backoff and Plan: rank 0's instance is billed all along
    launched = provision(g.ctl, JOB, plan(g.ctl, JOB, later, kept), later)
    job = g.job()
    assert launched.attempt == 2 and job.attempts[1].kept == 1
    assert job.attempts[0].drain_cost == pytest.approx(600 * PRICE_S)  # the survivor alone; the lost rank: none
    assert job.cost_so_far == pytest.approx(job.attempts[0].cost + 600 * PRICE_S)


def test_a_drained_rank_that_exits_before_the_relaunch_is_released_at_its_exit() -> None:
    """Its exit comes while the job is still on its attempt (the relaunch waits for capacity): its save is
    done, so it is released then (it idled, billed, until the relaunch and its drain's end before)."""
    g = Gangs()
    first = g.start(1)
    g.lose(first[1], 1, deadline=g.now + 120)
    for node in first:
        handle_agent_event(g.ctl, TrainingExited(**_ids(node), exit_code=75, reason="saved",  # type: ignore[arg-type]
                                                 last_step=40), g.now + 50)
    assert {n.instance_id for n in first} <= set(g.compute.terminated)
    assert g.job().attempt == 1 and g.job().cost_so_far == pytest.approx(2 * 50 * PRICE_S)


def test_a_drained_rank_that_never_reports_its_exit_is_charged_when_the_sweep_terminates_it() -> None:
    """No exit event (its agent died mid-save): the reconcile terminates it once its drain ran out and the
    job moved on, and charges it from the close to then, once."""
    g = Gangs()
    first = g.start(1)
    g.lose(first[1], 1, deadline=g.now + 120)
    provision(g.ctl, JOB, plan(g.ctl, JOB, g.now + 60), g.now + 60)
    assert g.job().cost_so_far == 0.0 and budget.draining(g.ctl, g.job(), g.now + 60)[1] == pytest.approx(2 * PRICE_S)
    swept = g.now + 120 + DRAIN_GRACE_S + 5
    report = reconcile(g.ctl, swept, regions=["us-east-1"], stale_after_s=1e9)
    assert set(report["orphans"]) == {n.instance_id for n in first}
    job = g.job()
    assert job.attempts[0].drain_cost == pytest.approx(2 * (swept - g.now) * PRICE_S) == job.cost_so_far
    reconcile(g.ctl, swept + 60, regions=["us-east-1"], stale_after_s=1e9)  # terminated and charged once
    assert g.job().cost_so_far == job.cost_so_far


@pytest.mark.parametrize("limit", [10.0, 12.0])
def test_plan_counts_the_ranks_still_draining_before_it_launches_a_gang_the_budget_pays(limit: float) -> None:
    """A new gang here costs $8.00 to boot (300 s) and save (the stop's 180 s lead) at $30 x 2 nodes;
    the two ranks draining the notice's save bill $3.00 over that lead: a $10 budget pays the gang alone
    but not both (refused now, within the budget), a $12 one pays both."""
    g = Gangs()
    g.ctl.market = QuotedMarket({"us-east-1/us-east-1b/p5.48xlarge/spot": 30.0})
    g.store.update_job(JOB, lambda j: j.model_copy(update={"spec": {**j.spec, "budget": {"max_total_cost": limit}}}))
    first = g.start(1)
    g.lose(first[1], 1, deadline=g.now + 120)
    if limit == 12.0:
        assert [c.pool.az for c in plan(g.ctl, JOB, g.now).candidates] == ["us-east-1b"]
        return
    with pytest.raises(BudgetExceededError, match=r"the \$7.00 left of the \$10.00 budget would not pay for a gang "
                                                  r"to boot and save \(\$8.00 in us-east-1/us-east-1b"):
        plan(g.ctl, JOB, g.now)
