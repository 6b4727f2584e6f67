"""EC2 event handlers with real-format events against moto: interruption notices, rebalance
recommendations, state changes. Duplicates, reordering and late events change nothing twice."""

from __future__ import annotations

from typing import Any

from functions import on_instance_state, on_interruption_notice, on_rebalance
from spotrelay.adapters.aws import client
from spotrelay.contracts.recovery import AttemptEnd, Verdict
from spotrelay.domain.models import NodeState
from spotrelay.domain.status import JobStatus
from spotrelay.settings import settings
from tests.integration.controller_doubles import Env, ctx, ec2_event, env, load_event, running_job

__all__ = ["env"]  # the fixture, imported for pytest


def _notice(instance_id: str, **over: Any) -> dict[str, Any]:
    event = ec2_event("ec2_spot_interruption_warning.json", instance_id)
    event.update(over)
    return event


def _idempotency_records() -> int:
    return int(client("dynamodb").scan(TableName=settings().idempotency_table, Select="COUNT")["Count"])


def test_sample_events_are_real_format(env: Env) -> None:
    notice = load_event("ec2_spot_interruption_warning.json")
    assert notice["detail-type"] == "EC2 Spot Instance Interruption Warning" and notice["source"] == "aws.ec2"
    assert set(notice["detail"]) == {"instance-id", "instance-action"}
    state = load_event("ec2_instance_state_terminated.json")
    assert set(state["detail"]) == {"instance-id", "state"}


def test_notice_dooms_node_directs_every_rank_and_cools_pool_once(env: Env) -> None:
    job, gang = running_job(env.store, env.compute, tokens={"outcome": "tok-out"})
    event = _notice(gang[0].instance_id)
    first = on_interruption_notice.handler(event, ctx())
    assert first["result"] == "applied" and first["directives"] == 2
    nodes = {n.node_id: n for n in env.store.nodes_of(job.job_id)}
    assert nodes["a1-r0"].state is NodeState.DOOMED and nodes["a1-r1"].state is NodeState.READY
    directive = nodes["a1-r1"].directive
    assert directive is not None and directive["kind"] == "CHECKPOINT_NOW"
    assert directive["deadline"] == event_time(event) + 120
    assert env.store.get_job(job.job_id).status is JobStatus.CHECKPOINTING
    version = env.store.get_job(job.job_id).version

    # the same event redelivered, and the same notice under a new event id (a forwarded copy)
    assert on_interruption_notice.handler(event, ctx()) == first
    assert on_interruption_notice.handler(_notice(gang[0].instance_id), ctx()) == first
    assert env.store.get_job(job.job_id).version == version
    assert env.stats.all()[gang[0].pool.key].interruptions == 1
    assert env.workflow.completed == []  # the outcome waits for the ranks' checkpoint and exit
    assert _idempotency_records() == 1  # one record for the notice, whatever its copies


def event_time(event: dict[str, Any]) -> float:
    from datetime import datetime

    return datetime.fromisoformat(event["time"].replace("Z", "+00:00")).timestamp()


def test_notice_for_unknown_instance_or_finished_job_is_a_no_op(env: Env) -> None:
    assert on_interruption_notice.handler(_notice("i-0ffffffffffffffff"), ctx())["why"] == "not a spotrelay node"
    job, gang = running_job(env.store, env.compute, status=JobStatus.RUNNING)
    env.store.update_job(job.job_id, lambda j: j.model_copy(update={"status": JobStatus.SUCCEEDED}))
    before = env.store.nodes_of(job.job_id)
    result = on_interruption_notice.handler(_notice(gang[0].instance_id), ctx())
    assert result["result"] == "ignored" and "SUCCEEDED" in result["why"]
    assert env.store.nodes_of(job.job_id) == before and env.stats.all() == {}


def test_unannounced_loss_settles_outcome_once_and_late_notice_is_ignored(env: Env) -> None:
    job, gang = running_job(env.store, env.compute, tokens={"outcome": "tok-out"})
    gone = ec2_event("ec2_instance_state_terminated.json", gang[1].instance_id)
    result = on_instance_state.handler(gone, ctx())
    assert result["node_state"] == "LOST" and result["settled"] == "node-lost"
    assert len(env.workflow.completed) == 1
    kind, token, sent = env.workflow.completed[0]
    end = AttemptEnd.model_validate(sent)
    assert (kind, token, end.outcome, end.attempt, end.lost_ranks) == ("success", "tok-out", Verdict.NODE_LOST, 1, (1,))
    assert "outcome" not in env.store.get_job(job.job_id).task_tokens
    # duplicates and the other states of the same disappearance, then the notice arriving late
    assert on_instance_state.handler(gone, ctx()) == result
    shutting = ec2_event("ec2_instance_state_shutting_down.json", gang[1].instance_id)
    assert on_instance_state.handler(shutting, ctx())["result"] == "ignored"
    late = on_interruption_notice.handler(_notice(gang[1].instance_id), ctx())
    assert late["result"] == "ignored" and "attempt ended" in late["why"]
    assert env.stats.all()[gang[1].pool.key].interruptions == 1  # still news about the pool
    assert env.store.get_job(job.job_id).status is JobStatus.RUNNING
    assert env.store.get_node(job.job_id, "a1-r0").directive is None
    assert len(env.workflow.completed) == 1
    assert env.store.get_node(job.job_id, "a1-r1").state is NodeState.LOST


def test_a_loss_is_recorded_when_ec2_cannot_say_why(env: Env, monkeypatch: Any) -> None:
    """Whether EC2 took a spot node is a ledger detail: a compute port that fails to answer must not
    stop the loss (it reads as a crash: billed, no ec2_reclaim_at)."""
    job, gang = running_job(env.store, env.compute, tokens={"outcome": "tok-out"})
    env.compute.reclaim(gang[1].instance_id)

    def broken(instance_id: str, region: str) -> bool:
        raise RuntimeError("EC2 config unreadable")

    monkeypatch.setattr(env.compute, "spot_reclaimed", broken)
    result = on_instance_state.handler(ec2_event("ec2_instance_state_terminated.json", gang[1].instance_id), ctx())
    assert result["node_state"] == "LOST" and result["settled"] == "node-lost"
    assert env.store.get_node(job.job_id, "a1-r1").ec2_reclaim_at is None


def test_announced_loss_is_terminated_not_lost(env: Env) -> None:
    _job, gang = running_job(env.store, env.compute, tokens={"outcome": "tok-out"})
    on_interruption_notice.handler(_notice(gang[0].instance_id), ctx())
    result = on_instance_state.handler(ec2_event("ec2_instance_state_terminated.json", gang[0].instance_id), ctx())
    assert result["node_state"] == "TERMINATED"
    assert result["settled"] is None  # rank 1 is still saving its part of the checkpoint
    assert env.workflow.completed == []


def test_notice_before_training_started_ends_the_ready_wait(env: Env) -> None:
    job, gang = running_job(env.store, env.compute, status=JobStatus.STARTING, tokens={"ready": "tok-ready"})
    result = on_interruption_notice.handler(_notice(gang[1].instance_id), ctx())
    assert result["settled"] == "interrupted"
    assert env.workflow.completed[0][2]["outcome"] == "interrupted"
    assert env.store.get_job(job.job_id).status is JobStatus.STARTING  # STARTING cannot checkpoint


def test_our_own_termination_is_not_a_loss(env: Env) -> None:
    from functions import sfn_teardown

    job, gang = running_job(env.store, env.compute, tokens={"outcome": "tok-out"})
    assert sorted(sfn_teardown.handler({"job_id": job.job_id}, ctx())["terminated"]) == sorted(
        n.instance_id for n in gang)
    result = on_instance_state.handler(ec2_event("ec2_instance_state_terminated.json", gang[0].instance_id), ctx())
    assert result["result"] == "ignored" and env.workflow.completed == []


def test_rebalance_asks_for_a_proactive_checkpoint_once(env: Env) -> None:
    job, gang = running_job(env.store, env.compute)
    event = ec2_event("ec2_rebalance_recommendation.json", gang[0].instance_id)
    result = on_rebalance.handler(event, ctx())
    assert result == {"result": "applied", "job_id": job.job_id, "directives": 2, "standby": False}
    assert env.store.get_job(job.job_id).status is JobStatus.CHECKPOINTING
    assert {n.directive["kind"] for n in env.store.nodes_of(job.job_id) if n.directive} == {"CHECKPOINT"}
    version = env.store.get_job(job.job_id).version
    assert on_rebalance.handler(event, ctx()) == result  # duplicate
    second = ec2_event("ec2_rebalance_recommendation.json", gang[1].instance_id)
    assert on_rebalance.handler(second, ctx())["result"] == "ignored"  # already checkpointing
    assert env.store.get_job(job.job_id).version == version
