"""Agent events (source ``spotrelay.agent``): the only way node state reaches the records. The agent
writes no item (its port, spotrelay/contracts/agent.py); these handlers are the one writer.

NodeReady, TrainingStarted, Heartbeat, NoticeSeen, DirectiveSeen, TrackingStarted,
CheckpointCommitted, TrainingExited, TrainingResumed, Anomaly: each updates its node and job with conditional writes
that only move forward (a duplicate, late or out-of-order event changes nothing), then settles the
workflow's waits. Events of an unknown node or a finished job are no-ops, and so are those of an
older attempt, except a draining rank's (recovery.launch_at_notice): its emergency commit counts
and its exit releases its node. A NodeReady of the attempt being launched (its node records exist
before the job moves to it) and a DirectiveSeen of any attempt apply to their node.
"""

from __future__ import annotations

import logging
from typing import Any

from spotrelay.contracts.events import (
    DEADLINE_AT_RISK,
    AgentEvent,
    Anomaly,
    CheckpointCommitted,
    DirectiveSeen,
    Heartbeat,
    NodeReady,
    NoticeSeen,
    TrackingStarted,
    TrainingExited,
    TrainingResumed,
    TrainingStarted,
)
from spotrelay.contracts.exit_codes import ExitCode
from spotrelay.domain.models import CheckpointRef, Job, Node, NodeState
from spotrelay.domain.status import JobStatus, transition
from spotrelay.errors import NotFoundError
from spotrelay.services.controller import Controller, attempt_nodes, release_nodes
from spotrelay.services.health import on_health_anomaly
from spotrelay.services.interruptions import notice_seen
from spotrelay.services.stop import finish_if_saved
from spotrelay.services.waits import heartbeat, settle

log = logging.getLogger(__name__)
_FINAL = (NodeState.EXITED, NodeState.LOST, NodeState.TERMINATED)


def _ignored(why: str, event: AgentEvent) -> dict[str, Any]:
    log.info("agent event ignored", extra={"job_id": event.job_id, "kind": event.kind, "why": why})
    return {"result": "ignored", "why": why, "kind": event.kind}


def handle_agent_event(ctl: Controller, event: AgentEvent, now: float) -> dict[str, Any]:
    job = ctl.store.find_job(event.job_id)
    if job is None:
        return _ignored("unknown job", event)
    if job.status.terminal:
        return _ignored(f"job already {job.status.value}", event)
    if isinstance(event, TrackingStarted):  # any attempt's rank 0, but only from a node we know
        known = _node_of(ctl, event)
        return known if isinstance(known, dict) else _on_tracking(ctl, job, event, now)
    if isinstance(event, (DirectiveSeen, NoticeSeen)) or (isinstance(event, NodeReady) and event.attempt > job.attempt):
        return _on_own_node(ctl, job, event, now)
    if event.attempt < job.attempt and isinstance(event, (CheckpointCommitted, TrainingExited)):
        return _from_earlier_attempt(ctl, job, event, now)
    if event.attempt != job.attempt:
        return _ignored(f"late: attempt {event.attempt}, the job is on attempt {job.attempt}", event)
    node = _node_of(ctl, event)
    if isinstance(node, dict):
        return node

    if isinstance(event, NodeReady):
        changed = _update_node(ctl, node, lambda n: _ready(n, event))
    elif isinstance(event, TrainingStarted):
        changed = _update_node(ctl, node, lambda n: n.model_copy(update={"state": NodeState.RUNNING})
                               if n.state in (NodeState.PENDING, NodeState.READY) else None)
    elif isinstance(event, Heartbeat):
        changed = _on_heartbeat(ctl, job, node, event, now)
    elif isinstance(event, CheckpointCommitted):
        changed = _on_checkpoint(ctl, job, event, now)
    elif isinstance(event, TrainingExited):
        changed = _on_exit(ctl, job, node, event, now)
    elif isinstance(event, TrainingResumed):
        changed = _on_resumed(ctl, job, event, now)
    else:
        assert isinstance(event, Anomaly)
        log.warning("agent anomaly", extra={"job_id": job.job_id, "node_id": node.node_id,
                                            "what": event.what, "detail": event.detail[:500]})
        changed = on_health_anomaly(ctl, job, node, event, now) or (
            event.what == DEADLINE_AT_RISK and _on_notice_at_risk(ctl, job, event, now))
    # Settle on every NodeReady / TrainingExited, changed or not: a duplicate may follow a lost
    # settle (a crash after the write), and settle is idempotent.
    decides = isinstance(event, (NodeReady, TrainingStarted, TrainingExited))
    verdict = settle(ctl, job.job_id, now) if decides else None
    if isinstance(event, TrainingExited) and job.stop_save_by is not None:
        finish_if_saved(ctl.store, ctl.need_workflow(), job.job_id)  # a stop that waited for the save
    return {"result": "applied" if changed else "no-op", "kind": event.kind,
            "settled": verdict.outcome.value if verdict else None}


def _node_of(ctl: Controller, event: AgentEvent) -> Node | dict[str, Any]:
    try:
        node = ctl.store.get_node(event.job_id, event.node_id)
    except NotFoundError:
        return _ignored("unknown node", event)
    if node.instance_id != event.instance_id or node.attempt != event.attempt:
        return _ignored("instance does not match the node", event)
    return node


def _ready(node: Node, event: NodeReady) -> Node | None:
    """Registered: PENDING -> READY, with the address (and rank 0's port) the others rendezvous on.
    A later state stays (TrainingStarted may come first); a final one is never undone."""
    update: dict[str, Any] = {}
    if node.state is NodeState.PENDING:
        update.update(state=NodeState.READY, last_heartbeat=max(node.last_heartbeat or 0, event.time))
    if node.state not in _FINAL:
        if event.private_ip and node.private_ip != event.private_ip:
            update["private_ip"] = event.private_ip
        if event.master_port is not None and node.master_port != event.master_port:
            update["master_port"] = event.master_port
    return node.model_copy(update=update) if update else None


def _on_own_node(ctl: Controller, job: Job, event: NodeReady | DirectiveSeen | NoticeSeen,
                 now: float) -> dict[str, Any]:
    """Events about the node itself, whichever attempt the job is on: the registration of a node of
    the attempt being launched, a directive taken (a survivor's RESTART is taken before the job
    moves to that attempt), a notice seen on IMDS (a spare's, or one of the current gang)."""
    node = _node_of(ctl, event)
    if isinstance(node, dict):
        return node
    if isinstance(event, NoticeSeen):
        return {**notice_seen(ctl, job, node, event.action_time, now), "kind": event.kind}
    if isinstance(event, NodeReady):
        if event.attempt != job.attempt + 1:
            return _ignored(f"early: attempt {event.attempt}, the job is on attempt {job.attempt}", event)
        changed = _update_node(ctl, node, lambda n: _ready(n, event))  # the ready wait settles once it exists
    else:
        directive_id = event.directive_id
        changed = _update_node(ctl, node, lambda n: n.model_copy(update={"directive": None})
                               if (n.directive or {}).get("directive_id") == directive_id else None)
    return {"result": "applied" if changed else "no-op", "kind": event.kind, "settled": None}


def _on_tracking(ctl: Controller, job: Job, event: TrackingStarted, now: float) -> dict[str, Any]:
    """The job's MLflow run: the first id recorded stays (rank 0's agent finds it again by tag)."""
    run_id = event.mlflow_run_id
    changed = ctl.store.update_job(job.job_id, lambda j: j.model_copy(update={"mlflow_run_id": run_id,
                                                                              "updated_at": now})
                                   if j.mlflow_run_id is None and not j.status.terminal else None)
    return {"result": "applied" if changed else "no-op", "kind": event.kind, "settled": None}


def _from_earlier_attempt(ctl: Controller, job: Job, event: CheckpointCommitted | TrainingExited,
                          now: float) -> dict[str, Any]:
    """A rank left to drain after a notice (its replacements already launched) commits its emergency
    save and exits: the save is the job's newest checkpoint; a dropped node is released on exit."""
    if isinstance(event, CheckpointCommitted):
        changed = _on_checkpoint(ctl, job, event, now)
        return {"result": "applied" if changed else "no-op", "kind": event.kind, "settled": None}
    try:
        node = ctl.store.get_node(event.job_id, event.node_id)
    except NotFoundError:
        return _ignored("unknown node", event)
    if node.release_after is None or node.instance_id != event.instance_id:
        return _ignored(f"late: attempt {event.attempt}, the job is on attempt {job.attempt}", event)
    changed = _update_node(ctl, node, lambda n: n.model_copy(update={
        "state": NodeState.EXITED, "exit_code": event.exit_code}) if n.state not in _FINAL else None)
    if event.exit_code == ExitCode.PREEMPTED_UNSAVED:
        log.warning("emergency save missed its deadline", extra={"job_id": job.job_id, "rank": event.rank})
        _count_unsaved(ctl, job, event, now)
    release_nodes(ctl, job, [ctl.store.get_node(job.job_id, node.node_id)], now)
    return {"result": "applied" if changed else "no-op", "kind": event.kind, "settled": None}


def _count_unsaved(ctl: Controller, job: Job, event: TrainingExited, now: float) -> None:
    """A drained rank's emergency save missed: what its attempt trained past the job's newest
    checkpoint is lost, counted once (recover counted none: the save was still to come)."""
    attempt, last = event.attempt, event.last_step or 0

    def count(j: Job) -> Job | None:
        mine = next((a for a in j.attempts if a.number == attempt), None)
        if mine is None or mine.lost_steps is not None or j.status.terminal:
            return None
        kept = j.last_checkpoint.step if j.last_checkpoint else 0
        lost = max(0, max(mine.reached_step or 0, last) - kept)
        attempts = [a.model_copy(update={"lost_steps": lost}) if a is mine else a for a in j.attempts]
        return j.model_copy(update={"attempts": attempts, "steps_lost": j.steps_lost + lost, "updated_at": now})

    ctl.store.update_job(job.job_id, count)


def _update_node(ctl: Controller, node: Node, change: Any) -> bool:
    return ctl.store.update_node(node.job_id, node.node_id, change) is not None


def _reached(job: Job, attempt: int, step: int) -> dict[str, Any]:
    """The job fields a step ``attempt``'s ranks reported moves: the job's furthest step and the
    attempt's (the steps it trained past the checkpoint the next attempt resumes from are lost)."""
    update: dict[str, Any] = {}
    if step > job.last_step:
        update["last_step"] = step
    attempts = [a.model_copy(update={"reached_step": step})
                if a.number == attempt and (a.reached_step is None or step > a.reached_step) else a
                for a in job.attempts]
    if attempts != job.attempts:
        update["attempts"] = attempts
    return update


def _record_step(ctl: Controller, job: Job, attempt: int, step: int, now: float) -> None:
    if not _reached(job, attempt, step):
        return  # (most heartbeats: nothing to write)

    def record(j: Job) -> Job | None:
        update = _reached(j, attempt, step)
        return j.model_copy(update={**update, "updated_at": now}) if update and not j.status.terminal else None

    ctl.store.update_job(job.job_id, record)


def _on_heartbeat(ctl: Controller, job: Job, node: Node, event: Heartbeat, now: float) -> bool:
    changed = _update_node(ctl, node, lambda n: n.model_copy(update={"last_heartbeat": event.time})
                           if (n.last_heartbeat or 0) < event.time and n.state not in _FINAL else None)
    if event.rank == 0 and event.step is not None:
        _record_step(ctl, job, event.attempt, event.step, now)
    heartbeat(ctl, job)
    return changed


def _on_checkpoint(ctl: Controller, job: Job, event: CheckpointCommitted, now: float) -> bool:
    doomed = any(n.state is NodeState.DOOMED for n in attempt_nodes(ctl.store, job))
    ref = CheckpointRef(step=event.step, uri=event.uri, committed_at=event.time, duration_s=event.duration_s)

    def record(j: Job) -> Job | None:
        newer = j.last_checkpoint is None or event.step > j.last_checkpoint.step
        back_to_running = j.status is JobStatus.CHECKPOINTING and not doomed and not event.emergency
        # the attempt whose ranks committed it keeps its newest save (its useful steps, the step rate;
        # placement/spot_evidence.py), also after the workflow closed it (a notice's or a move's save)
        attempts = [a.model_copy(update={"saved_step": event.step, "saved_at": event.time})
                    if a.number == event.attempt and (a.saved_step is None or event.step > a.saved_step) else a
                    for a in j.attempts]
        attempts = [a.model_copy(update={"reached_step": event.step}) if a.number == event.attempt and (
            a.reached_step is None or event.step > a.reached_step) else a for a in attempts]
        # only the rank that committed the manifest knows the checkpoint's size; its report may come second
        sized = event.total_bytes is not None and event.total_bytes != j.checkpoint_bytes and (
            j.last_checkpoint is None or event.step >= j.last_checkpoint.step)
        if not newer and not back_to_running and attempts == j.attempts and not sized:
            return None  # every rank reports the same global commit: the first one wins
        update: dict[str, Any] = {"updated_at": now}
        if newer:
            update["last_checkpoint"] = ref
            update["last_step"] = max(j.last_step, event.step)
        if sized:
            update["checkpoint_bytes"] = event.total_bytes
        if back_to_running:  # the proactive (rebalance) checkpoint is durable: keep training
            update["status"] = transition(j.status, JobStatus.RUNNING)
        if attempts != j.attempts:
            update["attempts"] = attempts
        return j.model_copy(update=update)

    changed = ctl.store.update_job(job.job_id, record) is not None
    if changed and (job.last_checkpoint is None or event.step > job.last_checkpoint.step):
        ctl.measure("CheckpointFlushSeconds", event.duration_s)
    return changed


def _on_notice_at_risk(ctl: Controller, job: Job, event: Anomaly, now: float) -> bool:
    """A rank's last save took longer than its notice left: the attempt is marked (once, whichever rank
    says it first), for describe's advice (domain/advice.notice_advice)."""

    def record(j: Job) -> Job | None:
        attempts = [a.model_copy(update={"notice_at_risk": True})
                    if a.number == event.attempt and not a.notice_at_risk else a for a in j.attempts]
        return None if attempts == j.attempts else j.model_copy(update={"attempts": attempts, "updated_at": now})

    return ctl.store.update_job(job.job_id, record) is not None


def _on_resumed(ctl: Controller, job: Job, event: TrainingResumed, now: float) -> bool:
    """The attempt's starting step is what its trainers restored (the first resume of the attempt;
    a rollback later in it does not move where it started)."""

    def record(j: Job) -> Job | None:
        attempts = [a.model_copy(update={"resumed_from_step": event.step, "resumed_at": event.time})
                    if a.number == event.attempt and a.resumed_from_step is None else a for a in j.attempts]
        return None if attempts == j.attempts else j.model_copy(update={"attempts": attempts, "updated_at": now})

    return ctl.store.update_job(job.job_id, record) is not None


def _on_exit(ctl: Controller, job: Job, node: Node, event: TrainingExited, now: float) -> bool:
    changed = _update_node(ctl, node, lambda n: n.model_copy(update={
        "state": NodeState.EXITED, "exit_code": event.exit_code, "output_tail": event.output_tail or None})
        if n.state not in _FINAL else None)
    if changed and event.last_step is not None:
        _record_step(ctl, job, event.attempt, event.last_step, now)
    fresh = ctl.store.get_node(job.job_id, node.node_id)
    if fresh.release_after is not None and not fresh.spare and fresh.state is NodeState.EXITED:
        # dropped by recover (or Plan) while it saved, and the relaunch has not happened yet (capacity,
        # a backoff): its save is done, so it goes now instead of idling, billed, until the relaunch
        release_nodes(ctl, job, [fresh], now)
    log.info("training exited", extra={"job_id": job.job_id, "rank": event.rank, "exit_code": event.exit_code,
                                       "reason": event.reason})
    return changed
