"""on_agent_event and sfn_register_wait with real-format agent events against moto: task tokens
completed once whatever the order; duplicates, old attempts and finished jobs change nothing."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from functions import on_agent_event, sfn_register_wait
from spotrelay.contracts.recovery import AttemptEnd, Verdict
from spotrelay.domain.models import NodeState
from spotrelay.domain.status import JobStatus
from tests.integration.controller_doubles import Env, agent_event, ctx, env, load_event, running_job

__all__ = ["env"]


def test_all_ready_completes_the_ready_wait_once(env: Env) -> None:
    job, gang = running_job(env.store, env.compute, status=JobStatus.STARTING, tokens={"ready": "tok-ready"})
    first = agent_event("NodeReady", gang[0])
    assert on_agent_event.handler(first, ctx())["settled"] is None  # rank 1 not ready yet
    assert on_agent_event.handler(first, ctx())["settled"] is None  # duplicate: cached result
    again = agent_event("NodeReady", gang[0])  # same report, new event id: a no-op
    assert on_agent_event.handler(again, ctx())["result"] == "no-op"
    assert on_agent_event.handler(agent_event("NodeReady", gang[1]), ctx())["settled"] == "ready"
    assert env.workflow.completed == [("success", "tok-ready", AttemptEnd(outcome=Verdict.READY, attempt=1).model_dump(
        mode="json"))]
    current = env.store.get_job(job.job_id)
    assert current.status is JobStatus.RUNNING and current.task_tokens == {}
    assert current.attempts[0].started_at is not None
    assert env.store.get_node(job.job_id, "a1-r1").private_ip == "10.0.1.17"


def test_token_registered_after_the_events_is_settled_at_registration(env: Env) -> None:
    job, gang = running_job(env.store, env.compute, status=JobStatus.STARTING)
    for node in gang:
        on_agent_event.handler(agent_event("NodeReady", node), ctx())
    assert env.workflow.completed == []  # nobody waits yet
    out = sfn_register_wait.handler({"job_id": job.job_id, "wait": "ready", "attempt": 1, "task_token": "late"},
                                    ctx())
    assert out == {"registered": True, "wait": "ready", "settled": True}
    assert env.workflow.completed[0][:2] == ("success", "late")
    assert env.store.get_job(job.job_id).status is JobStatus.RUNNING


def test_register_wait_for_a_cancelling_job_fails_the_token(env: Env) -> None:
    job, _ = running_job(env.store, env.compute)
    env.store.update_job(job.job_id, lambda j: j.model_copy(update={"status": JobStatus.CANCELLING}))
    out = sfn_register_wait.handler({"job_id": job.job_id, "wait": "outcome", "attempt": 1, "task_token": "t"},
                                    ctx())
    assert out["registered"] is False
    assert env.workflow.completed[0][0] == "failure" and env.workflow.completed[0][2]["error"] == "JobCancelledError"


def test_node_item_already_says_what_the_event_says(env: Env) -> None:
    """The records already say READY / EXITED when the event arrives (a redelivery after a handler
    crashed between its write and the settle): the wait is still settled."""
    job, gang = running_job(env.store, env.compute, status=JobStatus.STARTING, tokens={"ready": "tok-ready"})
    for node in gang:
        env.store.update_node(job.job_id, node.node_id, lambda n: n.model_copy(update={"state": NodeState.READY}))
    assert on_agent_event.handler(agent_event("NodeReady", gang[1]), ctx())["settled"] == "ready"
    sfn_register_wait.handler({"job_id": job.job_id, "wait": "outcome", "attempt": 1, "task_token": "tok-out"}, ctx())
    for node in gang:
        env.store.update_node(job.job_id, node.node_id, lambda n: n.model_copy(
            update={"state": NodeState.EXITED, "exit_code": 0}))
    assert on_agent_event.handler(agent_event("TrainingExited", gang[0], exit_code=0, reason="done"), ctx())[
        "settled"] == "succeeded"
    assert [c[1] for c in env.workflow.completed] == ["tok-ready", "tok-out"]


def test_exits_in_any_order_deliver_one_outcome(env: Env) -> None:
    job, gang = running_job(env.store, env.compute, tokens={"outcome": "tok-out"})
    assert on_agent_event.handler(agent_event("TrainingExited", gang[1], exit_code=0, reason="done"), ctx())[
        "settled"] is None
    done = agent_event("TrainingExited", gang[0], exit_code=0, reason="done", last_step=500)
    assert on_agent_event.handler(done, ctx())["settled"] == "succeeded"
    assert on_agent_event.handler(done, ctx())["settled"] == "succeeded"  # the cached first result
    assert len(env.workflow.completed) == 1 and env.workflow.completed[0][2]["outcome"] == "succeeded"
    assert env.store.get_job(job.job_id).last_step == 500


def test_user_error_ends_the_attempt_at_once(env: Env) -> None:
    _, gang = running_job(env.store, env.compute, tokens={"outcome": "tok-out"})
    result = on_agent_event.handler(agent_event("TrainingExited", gang[1], exit_code=1, reason="user-error"), ctx())
    assert result["settled"] == "user-error"
    assert env.workflow.completed[0][2]["exit_code"] == 1


def test_heartbeat_and_checkpoint_update_job_once(env: Env) -> None:
    job, gang = running_job(env.store, env.compute, tokens={"outcome": "tok-out"})
    on_agent_event.handler(agent_event("Heartbeat", gang[0], step=120), ctx())
    assert env.workflow.heartbeats == ["tok-out"]
    assert env.store.get_job(job.job_id).last_step == 120
    for node in gang:  # every node reports the same global commit
        on_agent_event.handler(agent_event("CheckpointCommitted", node, step=150, emergency=False), ctx())
    current = env.store.get_job(job.job_id)
    assert current.last_checkpoint is not None and current.last_checkpoint.step == 150
    version = current.version
    older = agent_event("CheckpointCommitted", gang[0], step=100, emergency=False)  # reordered: older commit
    assert on_agent_event.handler(older, ctx())["result"] == "no-op"
    assert env.store.get_job(job.job_id).version == version


def test_the_attempt_starts_where_its_trainers_resumed(env: Env) -> None:
    job, gang = running_job(env.store, env.compute)
    assert env.store.get_job(job.job_id).attempts[0].resumed_from_step is None  # launch does not guess
    assert on_agent_event.handler(agent_event("TrainingResumed", gang[0], step=110), ctx())["result"] == "applied"
    assert env.store.get_job(job.job_id).attempts[0].resumed_from_step == 110
    # a rollback later in the attempt restores an older step: where the attempt started stays
    assert on_agent_event.handler(agent_event("TrainingResumed", gang[0], step=100), ctx())["result"] == "no-op"
    assert env.store.get_job(job.job_id).attempts[0].resumed_from_step == 110


def test_the_attempt_keeps_its_resume_time_and_newest_save(env: Env) -> None:
    """What placement/spot_evidence.py reads: where and when the attempt's training resumed, and the
    newest checkpoint its ranks committed (every rank reports it; an older one changes nothing)."""
    job, gang = running_job(env.store, env.compute)
    resumed = agent_event("TrainingResumed", gang[0], step=100)
    on_agent_event.handler(resumed, ctx())
    for node in gang:
        on_agent_event.handler(agent_event("CheckpointCommitted", node, step=150, emergency=False), ctx())
    on_agent_event.handler(agent_event("CheckpointCommitted", gang[1], step=120, emergency=False), ctx())
    first = env.store.get_job(job.job_id).attempts[0]
    assert first.resumed_at == resumed["detail"]["time"]
    assert first.saved_step == 150 and first.saved_at is not None and first.saved_at >= first.resumed_at


def test_proactive_checkpoint_returns_job_to_running(env: Env) -> None:
    job, gang = running_job(env.store, env.compute, status=JobStatus.CHECKPOINTING)
    on_agent_event.handler(agent_event("CheckpointCommitted", gang[0], step=10, emergency=False), ctx())
    assert env.store.get_job(job.job_id).status is JobStatus.RUNNING


def test_late_events_are_no_ops(env: Env) -> None:
    job, gang = running_job(env.store, env.compute, tokens={"outcome": "tok-out"})
    old = agent_event("TrainingExited", gang[0], exit_code=75, reason="late", attempt=1)
    env.store.update_job(job.job_id, lambda j: j.model_copy(update={"attempt": 2}))
    assert "late" in on_agent_event.handler(old, ctx())["why"]
    env.store.update_job(job.job_id, lambda j: j.model_copy(update={"attempt": 1, "status": JobStatus.FAILED}))
    result = on_agent_event.handler(agent_event("TrainingExited", gang[1], exit_code=0, reason="x"), ctx())
    assert result["result"] == "ignored" and "FAILED" in result["why"]
    unknown = agent_event("NodeReady", gang[0], job_id="no-such-job")
    assert on_agent_event.handler(unknown, ctx())["why"] == "unknown job"
    assert all(n.state is NodeState.READY for n in env.store.nodes_of(job.job_id))
    assert env.workflow.completed == []


def test_anomaly_is_logged_only(env: Env) -> None:
    job, gang = running_job(env.store, env.compute)
    before = env.store.get_job(job.job_id)
    result = on_agent_event.handler(agent_event("Anomaly", gang[0], what="upload-failed"), ctx())
    assert result["result"] == "no-op" and env.store.get_job(job.job_id) == before


def test_a_notice_at_risk_marks_its_attempt_once_for_describes_advice(env: Env) -> None:
    """The agent's deadline-at-risk (its last save took longer than the notice left) is kept on the attempt:
    domain/advice.notice_advice reads it. Every rank says it; the first marks it."""
    job, gang = running_job(env.store, env.compute)
    assert not env.store.get_job(job.job_id).attempts[-1].notice_at_risk
    detail = "95s left, the last save took 135s; durable: step 40 s3://b/k"
    first = on_agent_event.handler(agent_event("Anomaly", gang[0], what="deadline-at-risk", detail=detail), ctx())
    assert first["result"] == "applied" and env.store.get_job(job.job_id).attempts[-1].notice_at_risk
    second = on_agent_event.handler(agent_event("Anomaly", gang[1], what="deadline-at-risk", detail=detail), ctx())
    assert second["result"] == "no-op"


def _health(kind: str, action: str, step: int, **more: object) -> dict[str, object]:
    return {"kind": kind, "action": action, "step": step, "detail": f"{kind} found", **more}


def test_health_anomaly_is_recorded_once_and_stop_gives_the_reason(env: Env) -> None:
    job, gang = running_job(env.store, env.compute)
    found = _health("non-finite", "stop", 7)
    event = agent_event("Anomaly", gang[0], what="non-finite", health=found)
    assert on_agent_event.handler(event, ctx())["result"] == "applied"
    again = agent_event("Anomaly", gang[0], what="non-finite", health=found)  # redelivered with a new id
    assert on_agent_event.handler(again, ctx())["result"] == "no-op"
    current = env.store.get_job(job.job_id)
    assert [(a.kind, a.action, a.step, a.attempt) for a in current.anomalies] == [("non-finite", "stop", 7, 1)]
    assert current.reasons[-1].startswith("health: non-finite at step 7 (stop)")
    assert current.status is JobStatus.RUNNING and env.workflow.completed == []


def test_straggler_replace_node_dooms_that_node_and_asks_every_rank_to_save(env: Env) -> None:
    job, gang = running_job(env.store, env.compute)
    found = _health("straggler", "replace-node", 40, rank=1, node_rank=1, value=2.4)
    on_agent_event.handler(agent_event("Anomaly", gang[0], what="straggler", health=found), ctx())
    nodes = {n.rank: n for n in env.store.nodes_of(job.job_id)}
    assert nodes[1].state is NodeState.DOOMED and nodes[0].state is NodeState.READY
    assert nodes[1].reclaim_at is not None and nodes[0].reclaim_at is None  # leaving, even once it exits
    assert {n.directive["kind"] for n in nodes.values() if n.directive} == {"CHECKPOINT_NOW"}
    assert all(n.directive for n in nodes.values())
    # save and stop now: a deadline would let the ranks train on through it at the straggler's pace
    assert all(n.directive["deadline"] is None for n in nodes.values() if n.directive)
    assert env.store.get_job(job.job_id).status is JobStatus.CHECKPOINTING


def test_malformed_agent_event_is_rejected(env: Env) -> None:
    event = load_event("agent_node_ready.json")
    del event["detail"]["instance_id"]
    with pytest.raises(ValidationError):
        on_agent_event.handler(event, ctx())


def test_the_failing_ranks_output_reaches_the_outcome_and_the_retry_verdict(env: Env) -> None:
    from spotrelay.errors import RetryBudgetExhaustedError
    from spotrelay.recovery import check_retry_budget
    from spotrelay.spec.models import Recovery

    _, gang = running_job(env.store, env.compute, tokens={"outcome": "tok-out"})
    tail = 'File "train.py", line 12, in <module>\nFileNotFoundError: data/shard-0.bin'
    on_agent_event.handler(agent_event("TrainingExited", gang[1], exit_code=1, reason="user-error",
                                       output_tail=tail), ctx())
    assert env.store.get_node(gang[1].job_id, gang[1].node_id).output_tail == tail
    end = env.workflow.completed[0][2]
    assert end["reason"].startswith("training code exited 1 on rank 1") and tail in end["reason"]
    with pytest.raises(RetryBudgetExhaustedError) as info:  # what the job's FAILED reason is made of
        check_retry_budget(Recovery(), AttemptEnd.model_validate(end), 0, 0)
    assert "FileNotFoundError: data/shard-0.bin" in str(info.value)
