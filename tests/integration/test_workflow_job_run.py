"""The job-run ASL executed end to end by moto's Step Functions, its Lambda tasks served by our
real handlers (lambda seam). The test plays the agents through on_agent_event and EC2 through the
EC2 event handlers, with real-format events; capacity comes from a scripted Compute double."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from functions import _runtime, on_agent_event, on_instance_state, on_interruption_notice
from spotrelay.adapters.dynamodb_job_store import DynamoDBJobStore
from spotrelay.adapters.sfn_workflow import SfnWorkflow
from spotrelay.contracts.workflow import WorkflowInput, WorkflowTimings
from spotrelay.domain.models import Job, Node
from spotrelay.domain.status import JobStatus
from spotrelay.local import workflow_setup
from spotrelay.placement import InMemoryPoolStatsStore
from spotrelay.services.cancel import request_cancel
from spotrelay.settings import reset
from tests.integration.controller_doubles import (
    CAPACITY,
    QuotedMarket,
    ScriptedCompute,
    agent_event,
    ctx,
    ec2_event,
    new_job,
    wait_until,
)

# No wait of these executions may time out while a test drives it (the tests about timeouts set 1 s):
# moto runs them in real time, and a loaded machine could take 20 s to deliver the NodeReady a test
# sends (ReadyTimedOut, an extra attempt) or 30 s between two events of one outcome wait (a missed
# heartbeat). 120 s is far above that and still ends a wait nobody answers well inside a test's 300 s
FAST = WorkflowTimings(ready_timeout_s=120, heartbeat_s=120, outcome_timeout_s=300, backoff_s=0, backoff_max_s=1,
                       provision_retry_s=0, loss_settle_s=1)


@dataclass
class Harness:
    store: DynamoDBJobStore
    compute: ScriptedCompute
    market: QuotedMarket
    stats: InMemoryPoolStatsStore
    workflow: SfnWorkflow

    def start(self, job: Job, timings: WorkflowTimings = FAST) -> str:
        arn = self.workflow.start(job.job_id, WorkflowInput(job_id=job.job_id, timings=timings).model_dump())
        self.store.update_job(job.job_id, lambda j: j.model_copy(update={"execution_arn": arn}))
        return arn

    def job(self, job_id: str = "job-under-test") -> Job:
        return self.store.get_job(job_id)

    def gang(self, attempt: int, job_id: str = "job-under-test") -> list[Node]:
        def ready() -> list[Node] | None:
            job = self.job(job_id)
            nodes = [n for n in self.store.nodes_of(job_id) if n.attempt == attempt]
            return nodes if job.attempt == attempt and job.status is JobStatus.STARTING and nodes else None
        nodes: list[Node] = wait_until(ready, what=f"attempt {attempt} launched")
        return sorted(nodes, key=lambda n: n.rank)

    def agents_ready(self, attempt: int) -> list[Node]:
        nodes = self.gang(attempt)
        for node in nodes:
            on_agent_event.handler(agent_event("NodeReady", node), ctx())
        wait_until(lambda: self.job().status is JobStatus.RUNNING, what="RUNNING")
        return nodes

    def exit_all(self, nodes: list[Node], code: int, **fields: Any) -> None:
        for node in nodes:
            on_agent_event.handler(agent_event("TrainingExited", node, exit_code=code, reason="test", **fields), ctx())

    def finished(self, arn: str) -> dict[str, Any]:
        out: dict[str, Any] = wait_until(
            lambda: (d := self.workflow.describe(arn))["status"] != "RUNNING" and d, what="execution end")
        return out

    def states_entered(self, arn: str) -> list[str]:
        from spotrelay.adapters.aws import client

        events = client("stepfunctions").get_execution_history(executionArn=arn, maxResults=1000)["events"]
        return [e["stateEnteredEventDetails"]["name"] for e in events if "stateEnteredEventDetails" in e]


@pytest.fixture
def wf(aws: dict[str, str]) -> Iterator[Harness]:
    arn = workflow_setup.create_workflow()
    os.environ["SPOTRELAY_STATE_MACHINE_ARN"] = arn
    reset()
    compute, market, stats = ScriptedCompute(), QuotedMarket(), InMemoryPoolStatsStore()
    _runtime.set_factories(compute=lambda: compute, market=lambda: market, pool_stats=lambda: stats)
    yield Harness(DynamoDBJobStore(), compute, market, stats, SfnWorkflow())
    _runtime.set_factories(compute=None, market=None, pool_stats=None)
    os.environ.pop("SPOTRELAY_STATE_MACHINE_ARN", None)
    reset()


def test_clean_success(wf: Harness) -> None:
    job = new_job(wf.store)
    arn = wf.start(job)
    nodes = wf.agents_ready(1)
    wf.exit_all(nodes, 0)
    assert wf.finished(arn)["status"] == "SUCCEEDED"
    final = wf.job()
    assert final.status is JobStatus.SUCCEEDED and final.attempt == 1 and final.recoveries == 0
    assert final.attempts[0].ended_at is not None and final.task_tokens == {}
    assert final.attempts[0].cost > 0 and final.cost_so_far == final.attempts[0].cost  # billed from launch
    assert wf.compute.running(job.job_id) == []
    assert sorted(wf.compute.terminated) == sorted(n.instance_id for n in nodes)
    assert wf.compute.tried == [wf.compute.launched[0].pool.key]  # the best pool had capacity
    assert "Recover" not in wf.states_entered(arn)


def test_one_interruption_then_success(wf: Harness) -> None:
    job = new_job(wf.store)
    arn = wf.start(job)
    first = wf.agents_ready(1)
    on_agent_event.handler(agent_event("Heartbeat", first[0], step=40), ctx())
    doomed = first[0]
    notice = ec2_event("ec2_spot_interruption_warning.json", doomed.instance_id, at=time.time())
    assert on_interruption_notice.handler(notice, ctx())["result"] == "applied"
    assert wf.job().status is JobStatus.CHECKPOINTING
    assert all(n.directive and n.directive["kind"] == "CHECKPOINT_NOW" for n in wf.store.nodes_of(job.job_id))
    on_agent_event.handler(agent_event("CheckpointCommitted", doomed, step=42, uri="s3://b/ckpt/step-42/",
                                       emergency=True), ctx())
    wf.exit_all(first, 75, last_step=42, last_committed_step=42)
    # EC2 takes the doomed instance away after the checkpoint: an announced loss, no double count; we
    # did not terminate it (noticed in its first hour: EC2's interruption is not billed, ours would be)
    assert doomed.instance_id not in wf.compute.terminated
    wf.compute.reclaim(doomed.instance_id)
    on_instance_state.handler(ec2_event("ec2_instance_state_terminated.json", doomed.instance_id), ctx())

    second = wf.agents_ready(2)
    job2 = wf.job()
    assert job2.recoveries == 1 and job2.attempts[0].end_reason == "interrupted"
    # the attempt's cost leaves out the doomed instance: EC2 takes it in its first hour, unbilled
    a, gone = job2.attempts[0], wf.store.get_node(job.job_id, doomed.node_id)
    assert a.ended_at is not None and a.started_at is not None and gone.ec2_reclaim_at is not None
    billed_s = a.nodes * (a.ended_at - a.started_at) - (a.ended_at - max(a.started_at, gone.launched_at))
    assert billed_s < a.nodes * (a.ended_at - a.started_at)
    assert a.cost == pytest.approx(a.price_per_hour * billed_s / 3600)
    assert job2.attempts[1].pool != job2.attempts[0].pool  # re-planned without the pool that failed
    assert job2.last_checkpoint is not None and job2.last_checkpoint.step == 42
    assert job2.attempts[1].resumed_from_step is None  # unknown until the trainers restore
    on_agent_event.handler(agent_event("TrainingResumed", second[0], step=42), ctx())
    assert wf.job().attempts[1].resumed_from_step == 42
    assert not set(wf.compute.running(job.job_id)) & {n.instance_id for n in first}
    wf.exit_all(second, 0)
    assert wf.finished(arn)["status"] == "SUCCEEDED"
    assert wf.job().status is JobStatus.SUCCEEDED and wf.compute.running(job.job_id) == []
    assert wf.stats.all()[job2.attempts[0].pool.key].interruptions == 1  # type: ignore[union-attr]


def test_unannounced_spot_reclaim_is_not_billed_a_crash_is(wf: Harness) -> None:
    """EC2's notice is best effort: a spot instance it takes without one is still its interruption
    (StateReason Server.SpotInstanceTermination, ``Compute.spot_reclaimed``) and EC2 bills none of its
    first hour; a crash is billed. The ledger tells them apart."""
    job = new_job(wf.store)
    arn = wf.start(job)
    first = wf.agents_ready(1)
    taken = first[1]
    wf.compute.reclaim(taken.instance_id)  # no notice reached us
    on_instance_state.handler(ec2_event("ec2_instance_state_terminated.json", taken.instance_id), ctx())
    second = wf.agents_ready(2)
    a, gone = wf.job().attempts[0], wf.store.get_node(job.job_id, taken.node_id)
    assert gone.state.value in ("LOST", "TERMINATED") and gone.ec2_reclaim_at is not None
    assert a.ended_at is not None and a.started_at is not None
    billed_s = a.nodes * (a.ended_at - a.started_at) - (a.ended_at - max(a.started_at, gone.launched_at))
    assert a.cost == pytest.approx(a.price_per_hour * billed_s / 3600)
    assert a.cost < a.price_per_hour * a.nodes * (a.ended_at - a.started_at) / 3600
    assert a.unbilled == pytest.approx(a.price_per_hour * a.nodes * (a.ended_at - a.started_at) / 3600 - a.cost)
    crashed = next(n for n in second if n.instance_id != taken.instance_id and n.attempt == 2)
    wf.compute.crash(crashed.instance_id)  # not EC2's interruption: billed in full
    on_instance_state.handler(ec2_event("ec2_instance_state_terminated.json", crashed.instance_id), ctx())
    third = wf.agents_ready(3)
    b = wf.job().attempts[1]
    assert wf.store.get_node(job.job_id, crashed.node_id).ec2_reclaim_at is None
    assert b.ended_at is not None and b.started_at is not None
    assert b.cost == pytest.approx(b.price_per_hour * b.nodes * (b.ended_at - b.started_at) / 3600)
    assert b.unbilled == 0.0
    wf.exit_all(third, 0)
    assert wf.finished(arn)["status"] == "SUCCEEDED"


def test_capacity_errors_in_every_spot_pool_then_on_demand(wf: Harness) -> None:
    wf.compute._fail = lambda pool, n: CAPACITY if pool.market == "spot" else None
    job = new_job(wf.store, spot_wait_minutes=0)  # unset, Plan would wait up to 2 h for spot first
    arn = wf.start(job)
    nodes = wf.agents_ready(1)
    spot = [k for k in wf.market.prices if k.endswith("/spot")]
    tried_spot = [k for k in wf.compute.tried if k.endswith("/spot")]
    assert sorted(set(tried_spot)) == sorted(spot)  # every spot pool was tried ...
    first_od = next(i for i, k in enumerate(wf.compute.tried) if k.endswith("/on-demand"))
    assert all(k.endswith("/spot") for k in wf.compute.tried[:first_od])  # ... before any on-demand
    assert wf.job().attempts[0].pool.market == "on-demand"  # type: ignore[union-attr]
    assert all(wf.stats.all()[k].capacity_failures >= 1 for k in spot)
    wf.exit_all(nodes, 0)
    assert wf.finished(arn)["status"] == "SUCCEEDED"


def test_retry_budget_exhausted_fails_with_reason_and_no_instance(wf: Harness) -> None:
    job = new_job(wf.store, max_recoveries=1)
    arn = wf.start(job)
    for attempt in (1, 2):
        nodes = wf.agents_ready(attempt)
        # an unannounced loss: the instance just disappears
        on_instance_state.handler(ec2_event("ec2_instance_state_terminated.json", nodes[1].instance_id), ctx())
    result = wf.finished(arn)
    assert result["status"] == "FAILED"
    final = wf.job()
    assert final.status is JobStatus.FAILED and final.recoveries == 1
    assert any("RetryBudgetExhaustedError" in r and "max_recoveries=1" in r for r in final.reasons), final.reasons
    assert wf.compute.running(job.job_id) == []
    assert "FailJob" in wf.states_entered(arn)


def test_cancel_while_running_tears_down(wf: Harness) -> None:
    job = new_job(wf.store)
    arn = wf.start(job)
    wf.agents_ready(1)
    wait_until(lambda: "outcome" in wf.job().task_tokens, what="outcome wait registered")
    request_cancel(job.job_id, store=wf.store, workflow=wf.workflow, now=0.0, reason="test")
    result = wf.finished(arn)
    assert result["status"] == "SUCCEEDED", json.dumps(result, default=str)
    assert wf.job().status is JobStatus.CANCELLED
    assert wf.compute.running(job.job_id) == []
    assert "Cancel" in wf.states_entered(arn)
