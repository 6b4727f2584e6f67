"""A recovery that backs off before its next launch keeps no spot survivors (recovery_flow.recover).

The failure streak's backoff (30 s, doubling to 600 s after attempts that each ran under an hour) is a
wait before Plan launches again. Survivors kept through more than ``KEEP_BACKOFF_MAX_S`` of it (two
minutes: a fourth short attempt in a row) are billed idle, in the pool whose gangs keep dying, and there
they are often reclaimed before their replacements come (the
simulator's node reading of the g4dn trace: kept gangs that died at their start, docs/simulator-tuning.md
"Survivors through a backoff"). After a notice there is no backoff: the survivors stay."""

from __future__ import annotations

import time

from spotrelay.adapters.memory_job_store import MemoryJobStore
from spotrelay.contracts.recovery import AttemptEnd, RecoveryAction, Verdict
from spotrelay.contracts.workflow import WorkflowTimings
from spotrelay.domain.models import Attempt, Job, Node, NodeState
from spotrelay.domain.status import JobStatus
from spotrelay.placement import InMemoryPoolStatsStore
from spotrelay.ports.compute import LaunchRequest
from spotrelay.recovery.strategies import KEEP_BACKOFF_MAX_S
from spotrelay.services.controller import Controller
from spotrelay.services.recovery_flow import failure_streak, recover, recovery_backoff_s
from tests.integration.controller_doubles import QuotedMarket, ScriptedCompute, new_job, pool

JOB = "job-backoff"


def _stormy_job(now: float, short: int = 3) -> tuple[MemoryJobStore, ScriptedCompute, list[str]]:
    """``short`` attempts ran 10 minutes each; the next one's gang (4 ranks, spot) lost rank 3 five
    minutes in."""
    store, compute = MemoryJobStore(), ScriptedCompute()
    new_job(store, job_id=JOB, status=JobStatus.RUNNING, strategy="replace-lost-nodes")
    where = pool()
    current = short + 1
    gang = compute.launch(LaunchRequest(job_id=JOB, attempt=current, pool=where, count=4, ranks=[0, 1, 2, 3]))
    for inst in gang:
        store.put_node(Node(job_id=JOB, node_id=f"a{current}-r{inst.rank}", attempt=current, rank=inst.rank,
                            instance_id=inst.instance_id, pool=where, launched_at=now - 300,
                            state=NodeState.LOST if inst.rank == 3 else NodeState.RUNNING))
    store.update_job(JOB, lambda j: j.model_copy(update={
        "attempt": current, "spec": {**j.spec, "resources": {**j.spec["resources"], "nodes": 4}},
        "attempts": [*(Attempt(number=i + 1, pool=where, price_per_hour=30.0, nodes=4,
                               started_at=now - 900 * (short - i) - 600, ended_at=now - 900 * (short - i),
                               end_reason="node-lost") for i in range(short)),
                     Attempt(number=current, pool=where, price_per_hour=30.0, nodes=4, started_at=now - 300)]}))
    return store, compute, [i.instance_id for i in gang if i.rank != 3]


def test_the_ending_attempt_counts_in_the_backoff_before_it_is_closed() -> None:
    now, timings = time.time(), WorkflowTimings(backoff_s=30, backoff_max_s=600, healthy_s=3600)
    store, _, _ = _stormy_job(now, short=1)
    job = store.get_job(JOB)
    lost = AttemptEnd(outcome=Verdict.NODE_LOST, attempt=2, reason="rank 3 lost", lost_ranks=(3,))
    assert failure_streak(job, timings) == 1  # attempt 2 is still open: not counted
    assert failure_streak(job, timings, now) == 2 and recovery_backoff_s(job, timings, lost, now) == 60
    closed = job.model_copy(update={"attempts": [job.attempts[0], job.attempts[1].model_copy(
        update={"ended_at": now})]})
    assert recovery_backoff_s(closed, timings, lost) == 60  # what the plan's backoff_s says, once closed
    noticed = lost.model_copy(update={"outcome": Verdict.INTERRUPTED, "deadline": now + 120})
    assert recovery_backoff_s(job, timings, noticed, now) == 0


def test_spot_survivors_are_released_when_the_recovery_backs_off() -> None:
    now, timings = time.time(), WorkflowTimings(backoff_s=30, backoff_max_s=600, healthy_s=3600)
    store, compute, survivors = _stormy_job(now)
    ctl = Controller(store=store, compute=compute, market=QuotedMarket(), pool_stats=InMemoryPoolStatsStore())
    end = AttemptEnd(outcome=Verdict.NODE_LOST, attempt=4, reason="rank 3 lost", lost_ranks=(3,))

    plan = recover(ctl, JOB, end, timings, now)

    assert plan.backoff_s == 240 > KEEP_BACKOFF_MAX_S and plan.action is RecoveryAction.NEW_CLUSTER, plan
    assert plan.keep_instance_ids == [] and plan.launch_ranks == [0, 1, 2, 3]
    assert set(survivors) <= set(compute.terminated)  # not billed through the wait
    job: Job = store.get_job(JOB)
    assert job.status is JobStatus.RECOVERING and job.attempts[-1].ended_at == now


def test_after_a_notice_the_survivors_stay() -> None:
    now, timings = time.time(), WorkflowTimings(backoff_s=30, backoff_max_s=600, healthy_s=3600)
    store, compute, survivors = _stormy_job(now)
    store.update_node(JOB, "a4-r3", lambda n: n.model_copy(update={"state": NodeState.DOOMED, "reclaim_at": now + 120}))
    ctl = Controller(store=store, compute=compute, market=QuotedMarket(), pool_stats=InMemoryPoolStatsStore())
    end = AttemptEnd(outcome=Verdict.INTERRUPTED, attempt=4, reason="notice for rank 3", lost_ranks=(3,),
                     deadline=now + 120)

    plan = recover(ctl, JOB, end, timings, now)

    assert plan.backoff_s == 0 and plan.action is RecoveryAction.REPLACE_LOST, plan
    assert sorted(plan.keep_instance_ids) == sorted(survivors) and plan.launch_ranks == [3]


def test_a_short_streak_keeps_the_survivors() -> None:
    # a second short attempt: a 60 s backoff, within KEEP_BACKOFF_MAX_S (the demo's unannounced loss)
    now, timings = time.time(), WorkflowTimings(backoff_s=30, backoff_max_s=600, healthy_s=3600)
    store, compute, survivors = _stormy_job(now, short=1)
    ctl = Controller(store=store, compute=compute, market=QuotedMarket(), pool_stats=InMemoryPoolStatsStore())
    end = AttemptEnd(outcome=Verdict.NODE_LOST, attempt=2, reason="rank 3 lost", lost_ranks=(3,))

    plan = recover(ctl, JOB, end, timings, now)

    assert plan.backoff_s == 60 and plan.action is RecoveryAction.REPLACE_LOST, plan
    assert sorted(plan.keep_instance_ids) == sorted(survivors)
