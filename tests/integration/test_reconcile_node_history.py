"""A long job's node records are bounded (services/node_history.py): the reconcile sweep deletes, in
moto's DynamoDB, the records no reader needs (ended, of an attempt five or more behind, or carried into a
newer record), keeps every live one whatever its attempt, and leaves a record that changed since it was
read."""

from __future__ import annotations

import copy
import time

from functions import reconcile
from spotrelay.domain.models import Node, NodeState
from spotrelay.services.node_history import NODE_ATTEMPTS_KEPT, prunable
from tests.integration.controller_doubles import Env, ctx, env, load_event, pool, running_job

__all__ = ["env"]


def _record(job_id: str, attempt: int, rank: int, state: NodeState, instance: str | None = None,
            **extra: object) -> Node:
    return Node(job_id=job_id, node_id=f"a{attempt}-r{rank}", attempt=attempt, rank=rank,
                instance_id=instance or f"i-{attempt:03d}{rank:03d}", pool=pool(), state=state,
                launched_at=time.time() - (20 - attempt) * 600, **extra)  # type: ignore[arg-type]


def _sweep(minute: int) -> dict[str, object]:
    event = copy.deepcopy(load_event("scheduled_event.json"))
    event["time"] = f"2026-11-30T04:{minute:02d}:00Z"  # (another sweep: the handler is idempotent per event)
    return reconcile.handler(event, ctx())


def _long_job(env: Env) -> str:
    """Attempt 12 of a job whose eleven earlier attempts left their records."""
    job, gang = running_job(env.store, env.compute, tokens={"outcome": "tok-out"})
    env.workflow.executions[job.execution_arn or ""] = "RUNNING"
    for node in gang:  # the current gang: attempt 12's
        env.store.update_node(job.job_id, node.node_id, lambda n: n.model_copy(update={
            "state": NodeState.TERMINATED}))
    for attempt in range(2, 12):
        for rank in (0, 1):
            if (attempt, rank) != (3, 1):
                env.store.put_node(_record(job.job_id, attempt, rank, NodeState.TERMINATED))
    live = [
        _record(job.job_id, 12, 0, NodeState.RUNNING, last_heartbeat=time.time()),
        _record(job.job_id, 12, 1, NodeState.RUNNING, instance="i-carried", last_heartbeat=time.time()),
        _record(job.job_id, 3, 1, NodeState.RUNNING, instance="i-carried"),  # carried since: its old record
        _record(job.job_id, 2, 2, NodeState.READY, spare=True),  # a hot spare standing by since attempt 2
        _record(job.job_id, 4, 5, NodeState.EXITED, release_after=time.time() + 3600),  # still draining
    ]
    for node in live:
        env.store.put_node(node)
    env.store.update_job(job.job_id, lambda j: j.model_copy(update={"attempt": 12}))
    return job.job_id


def test_the_sweep_deletes_the_records_no_reader_needs(env: Env) -> None:
    job_id = _long_job(env)
    before = {n.node_id for n in env.store.nodes_of(job_id)}
    report = _sweep(1)
    after = {n.node_id for n in env.store.nodes_of(job_id)}
    floor = 12 - NODE_ATTEMPTS_KEPT  # attempt 7: every ended record up to it goes
    gone = {f"a{a}-r{r}" for a in range(1, floor + 1) for r in (0, 1)}  # (a3-r1: carried since)
    assert before - after == gone and report["pruned"] == len(gone)
    assert {"a2-r2", "a4-r5", "a12-r0", "a12-r1"} <= after  # live: a spare, a drain, the gang
    assert {f"a{a}-r0" for a in range(floor + 1, 12)} <= after  # the newest attempts' records stay
    again = _sweep(2)
    assert again["pruned"] == 0 and {n.node_id for n in env.store.nodes_of(job_id)} == after


def test_a_record_that_changed_since_it_was_read_stays(env: Env) -> None:
    job_id = _long_job(env)
    job = env.store.get_job(job_id)
    read = next(n for n in prunable(job, env.store.nodes_of(job_id), time.time()) if n.node_id == "a2-r0")
    env.store.update_node(job_id, "a2-r0", lambda n: n.model_copy(update={"exit_code": 0}))  # a late event
    assert env.store.delete_node(read) is False
    assert env.store.get_node(job_id, "a2-r0").exit_code == 0
    fresh = env.store.get_node(job_id, "a2-r0")
    assert env.store.delete_node(fresh) is True and env.store.delete_node(fresh) is False  # gone: False
