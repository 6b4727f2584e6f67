"""Hot spares (resources.spares) and rebalance standbys (recovery.prewarm_on_rebalance) in moto's
Step Functions with our handlers: a spare takes a doomed or lost rank (no launch for that rank), a
new spare is launched in the background, and spares and standbys are billed in the ledger."""

from __future__ import annotations

import time

import pytest

from functions import on_agent_event, on_instance_state, on_interruption_notice, on_rebalance
from spotrelay.contracts.workflow import WorkflowTimings
from spotrelay.domain.models import Node, NodeState
from spotrelay.domain.status import JobStatus
from spotrelay.services.controller import Controller
from spotrelay.services.describe import cost_report
from spotrelay.services.reconcile import reconcile
from tests.integration.controller_doubles import agent_event, ctx, ec2_event, new_job, wait_until
from tests.integration.test_workflow_job_run import FAST, Harness, wf

__all__ = ["wf"]


def _spare_job(wf: Harness) -> tuple[str, list[Node], Node]:
    job = new_job(wf.store, strategy="replace-lost-nodes", launch_at_notice=True)
    wf.store.update_job(job.job_id, lambda j: j.model_copy(update={
        "spec": {**j.spec, "resources": {**j.spec["resources"], "spares": 1}}}))
    arn = wf.start(job)
    everyone = wf.gang(1)
    gang = [n for n in everyone if not n.spare]
    spares = [n for n in everyone if n.spare]
    assert [n.rank for n in gang] == [0, 1] and [n.rank for n in spares] == [2]
    assert wf.compute.launched[0].ranks == [0, 1, 2]  # the spare boots with the gang, in its pool
    for node in everyone:
        on_agent_event.handler(agent_event("NodeReady", node), ctx())
    wait_until(lambda: wf.job().status is JobStatus.RUNNING, what="RUNNING")
    first = wf.job().attempts[0]
    assert (first.nodes, first.spares) == (3, 1)  # billed with the gang
    return arn, gang, spares[0]


def _attempt(wf: Harness, attempt: int) -> list[Node]:
    def launched() -> list[Node] | None:
        job = wf.job()
        nodes = [n for n in wf.store.nodes_of(job.job_id) if n.attempt == attempt]
        return nodes if job.attempt == attempt and job.status is JobStatus.STARTING else None
    found: list[Node] = wait_until(launched, what=f"attempt {attempt}")
    return sorted(found, key=lambda n: n.rank)


def _finish(wf: Harness, arn: str, nodes: list[Node]) -> None:
    gang = [n for n in nodes if not n.spare]
    for node in gang:
        on_agent_event.handler(agent_event("NodeReady", node), ctx())
    wait_until(lambda: wf.job().status is JobStatus.RUNNING, what="RUNNING again")
    wf.exit_all(gang, 0)
    assert wf.finished(arn)["status"] == "SUCCEEDED"
    assert wf.compute.running("job-under-test") == []  # the spares are torn down with the job


def test_a_spare_takes_the_doomed_rank_at_the_notice(wf: Harness) -> None:
    arn, (survivor, doomed), spare = _spare_job(wf)
    notice = ec2_event("ec2_spot_interruption_warning.json", doomed.instance_id)
    assert on_interruption_notice.handler(notice, ctx())["result"] == "applied"
    second = _attempt(wf, 2)
    ranks = {n.rank: n for n in second if not n.spare}
    assert ranks[0].instance_id == survivor.instance_id
    assert ranks[1].instance_id == spare.instance_id  # the spare takes rank 1: nothing boots for it
    assert ranks[1].directive is not None and ranks[1].directive["kind"] == "RESTART"
    assert ranks[1].directive["rank"] == 1
    assert [r.ranks for r in wf.compute.launched] == [[0, 1, 2], [2]]  # only a new spare, in the background
    assert [n.spare for n in second if n.rank == 2] == [True]
    assert wf.store.get_node("job-under-test", spare.node_id).state is NodeState.EXITED  # off the bench
    assert (wf.job().attempts[1].nodes, wf.job().attempts[1].spares) == (3, 1)
    assert wf.job().attempts[1].kept == 2  # the survivor and the promoted spare: billed in attempt 1 before
    wf.exit_all([survivor, doomed], 75, last_step=8, last_committed_step=8)
    _finish(wf, arn, second)


def test_a_spare_takes_a_rank_lost_without_notice(wf: Harness) -> None:
    arn, (survivor, lost), spare = _spare_job(wf)
    on_instance_state.handler(ec2_event("ec2_instance_state_terminated.json", lost.instance_id), ctx())
    second = _attempt(wf, 2)
    ranks = {n.rank: n for n in second if not n.spare}
    assert (ranks[0].instance_id, ranks[1].instance_id) == (survivor.instance_id, spare.instance_id)
    assert [r.ranks for r in wf.compute.launched] == [[0, 1, 2], [2]]
    _finish(wf, arn, second)


def test_a_doomed_spare_leaves_the_gang_alone(wf: Harness) -> None:
    arn, gang, spare = _spare_job(wf)
    wait_until(lambda: "outcome" in wf.job().task_tokens, what="outcome wait registered")
    notice = ec2_event("ec2_spot_interruption_warning.json", spare.instance_id)
    assert on_interruption_notice.handler(notice, ctx())["node_state"] == "DOOMED"
    current = wf.job()
    assert current.status is JobStatus.RUNNING and current.attempt == 1 and "outcome" in current.task_tokens
    assert [wf.store.get_node(n.job_id, n.node_id).directive for n in gang] == [None, None]
    wf.exit_all(gang, 0)
    assert wf.finished(arn)["status"] == "SUCCEEDED"


def _prewarm_job(wf: Harness, timings: WorkflowTimings = FAST) -> tuple[str, list[Node]]:
    job = new_job(wf.store, strategy="replace-lost-nodes", launch_at_notice=True, prewarm_on_rebalance=True,
                  prewarm_wait_s=60)
    arn = wf.start(job, timings)
    gang = wf.agents_ready(1)
    wait_until(lambda: "outcome" in wf.job().task_tokens, what="outcome wait registered")
    rebalance = ec2_event("ec2_rebalance_recommendation.json", gang[1].instance_id)
    assert on_rebalance.handler(rebalance, ctx())["standby"] is True
    standby = wait_until(lambda: [n for n in wf.store.nodes_of(job.job_id) if n.spare], what="standby launched")
    assert [n.rank for n in standby] == [2] and standby[0].pool == gang[1].pool
    assert standby[0].release_after is not None
    wait_until(lambda: "outcome" in wf.job().task_tokens, what="waiting for the outcome again")
    assert "Prewarm" in wf.states_entered(arn) and wf.job().attempt == 1
    return arn, gang + standby


def test_a_rebalance_standby_takes_the_rank_when_the_notice_follows(wf: Harness) -> None:
    arn, (survivor, doomed, standby) = _prewarm_job(wf)
    notice = ec2_event("ec2_spot_interruption_warning.json", doomed.instance_id)
    assert on_interruption_notice.handler(notice, ctx())["result"] == "applied"
    second = _attempt(wf, 2)
    ranks = {n.rank: n for n in second if not n.spare}
    assert (ranks[0].instance_id, ranks[1].instance_id) == (survivor.instance_id, standby.instance_id)
    assert ranks[1].release_after is None  # a rank now, not a standby
    assert [r.ranks for r in wf.compute.launched] == [[0, 1], [2]]  # nothing launched for rank 1
    assert wf.job().standby_cost > 0  # its time before the new attempt: in the ledger, kept apart
    wf.exit_all([survivor, doomed], 75, last_step=8, last_committed_step=8)
    _finish(wf, arn, second)


def test_a_prewarm_counts_toward_the_hand_over_and_the_next_execution_waits_for_the_outcome(wf: Harness) -> None:
    """A rebalance loops back to the outcome wait without a Review: its Prewarm is a pass too, or a storm
    of recommendations would fill the 25,000-event history uncounted (services/handover.py). At
    max_hops the job goes on in a new execution at WaitOutcome, and what happens next happens there."""
    arn, (survivor, doomed, standby) = _prewarm_job(wf, FAST.model_copy(update={"max_hops": 2}))
    assert wf.finished(arn)["status"] == "SUCCEEDED"  # pass 1 Plan, pass 2 the Prewarm: handed over
    assert wf.states_entered(arn)[-4:] == ["HopPrewarm", "HopPrewarmCheck", "HandOverWait", "HandedOver"]
    following = wf.job().execution_arn
    assert following is not None and following.endswith(":job-under-test-h1-2")
    assert wf.states_entered(following)[:2] == ["Entry", "WaitOutcome"]
    notice = ec2_event("ec2_spot_interruption_warning.json", doomed.instance_id)
    assert on_interruption_notice.handler(notice, ctx())["result"] == "applied"
    second = _attempt(wf, 2)  # the new execution's outcome wait took the notice; the standby takes rank 1
    ranks = {n.rank: n for n in second if not n.spare}
    assert (ranks[0].instance_id, ranks[1].instance_id) == (survivor.instance_id, standby.instance_id)
    wf.exit_all([survivor, doomed], 75, last_step=8, last_committed_step=8)
    _finish(wf, following, second)
    assert wf.job().status is JobStatus.SUCCEEDED and wf.job().recoveries == 1


def test_an_unused_standby_is_released_and_billed(wf: Harness) -> None:
    arn, (*gang, standby) = _prewarm_job(wf)
    ctl = Controller(store=wf.store, workflow=wf.workflow, compute=wf.compute)
    assert standby.release_after is not None
    before = wf.job().cost_so_far
    assert reconcile(ctl, now=standby.release_after - 1)["standbys"] == []
    assert reconcile(ctl, now=standby.release_after)["standbys"] == [standby.instance_id]
    assert standby.instance_id not in wf.compute.running("job-under-test")
    job = wf.job()
    assert job.cost_so_far > before  # its time is in the ledger, kept apart: no attempt holds it
    assert job.standby_cost == pytest.approx(job.cost_so_far - before) and job.standby_cost > 0
    report = cost_report(job, standby.release_after, wf.store.nodes_of(job.job_id))
    assert (report.standby, report.standing_by) == (round(job.standby_cost, 4), 0)
    wf.exit_all(gang, 0)
    assert wf.finished(arn)["status"] == "SUCCEEDED"
    assert wf.job().standby_cost == job.standby_cost  # the teardown charges it once


def test_a_standby_standing_by_when_the_job_ends_is_charged_by_the_teardown(wf: Harness) -> None:
    arn, (*gang, standby) = _prewarm_job(wf)
    report = cost_report(wf.job(), time.time(), wf.store.nodes_of("job-under-test"))
    assert (report.standby, report.standing_by) == (0.0, 1)  # billed, charged at its end
    wf.exit_all(gang, 0)  # the job finishes within the standby's wait: the teardown ends it
    assert wf.finished(arn)["status"] == "SUCCEEDED"
    assert standby.instance_id not in wf.compute.running("job-under-test")
    job = wf.job()
    assert job.standby_cost > 0  # the ledger: the attempt's instance-hours and the standby's
    assert job.cost_so_far == pytest.approx(sum(a.cost + a.drain_cost for a in job.attempts) + job.standby_cost)
    final = cost_report(job, time.time(), wf.store.nodes_of("job-under-test"))
    assert (final.standby, final.standing_by) == (round(job.standby_cost, 4), 0)
    assert final.total == pytest.approx(sum(line.cost for line in final.lines) + final.standby, abs=1e-3)


def test_a_promoted_spare_that_left_meanwhile_gets_its_rank_launched() -> None:
    """The spare recover gave rank 1 was reclaimed before provision ran (one capacity drop takes the
    doomed rank and the spare): provision launches rank 1 instead, so the gang is whole when ready."""
    from spotrelay.adapters.memory_job_store import MemoryJobStore
    from spotrelay.contracts.recovery import Candidate, LaunchPlan, Promotion
    from spotrelay.placement import InMemoryPoolStatsStore
    from spotrelay.services import workflow_tasks
    from tests.integration.controller_doubles import QuotedMarket, ScriptedCompute, pool

    store, compute = MemoryJobStore(), ScriptedCompute()
    ctl = Controller(store=store, compute=compute, market=QuotedMarket(), pool_stats=InMemoryPoolStatsStore())
    job = new_job(store, status=JobStatus.PLACING, strategy="replace-lost-nodes")
    home = pool()
    store.put_node(Node(job_id=job.job_id, node_id="old-r0", attempt=0, rank=0, instance_id="i-keep", pool=home,
                        state=NodeState.READY))
    store.put_node(Node(job_id=job.job_id, node_id="old-s2", attempt=0, rank=2, instance_id="i-spare", pool=home,
                        state=NodeState.DOOMED, spare=True, takes_rank=1))
    plan = LaunchPlan(candidates=[Candidate(pool=home, price_per_hour=1.0, score=1.0)], launch_ranks=[],
                      keep_instance_ids=["i-keep"], promoted=[Promotion(rank=1, instance_id="i-spare")])
    workflow_tasks.provision(ctl, job.job_id, plan, now=1000.0)
    assert compute.launched[-1].ranks[0] == 1  # the rank the gone spare was to take (then a new spare)
    gang = sorted(n.rank for n in store.nodes_of(job.job_id) if n.attempt == 1 and not n.spare)
    assert gang == [0, 1]
