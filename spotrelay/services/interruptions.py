"""EC2 events about our instances: spot interruption notices, rebalance recommendations, and
state changes (stopping, stopped, shutting-down, terminated).

- A notice dooms the node (with its reclaim time), tells every rank to checkpoint now (deadline =
  the reclaim time), cools the pool down, and moves a RUNNING job to CHECKPOINTING. With the spec's
  ``recovery.launch_at_notice`` the settle that follows ends the attempt at once, so the workflow's
  recover launches the doomed ranks' replacements during the window (one writer: recover decides).
- A rebalance recommendation asks for a proactive checkpoint (RUNNING -> CHECKPOINTING -> RUNNING).
- A state change of a node we did not retire is a loss: announced (doomed) nodes become
  TERMINATED, unannounced ones LOST, and the workflow's waits are settled. An unannounced spot loss
  that EC2's record calls its own interruption (the notice never reached us) gets ``ec2_reclaim_at``
  like a noticed one, so the attempt's cost leaves out what EC2 does not bill.

Instances that are not ours, nodes of an older attempt, and finished jobs are no-ops.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from spotrelay.contracts.events import Directive, DirectiveKind
from spotrelay.domain.models import Job, Node, NodeState
from spotrelay.domain.status import JobStatus, transition
from spotrelay.placement import PoolEvent
from spotrelay.services.controller import Controller, current_node, direct_nodes, unannounced_reclaim
from spotrelay.services.prewarm import request_standby
from spotrelay.services.waits import settle

log = logging.getLogger(__name__)
NOTICE_LEAD_S = 120.0  # EC2 reclaims a spot instance two minutes after the warning
_GONE = (NodeState.LOST, NodeState.TERMINATED)


def _ignored(why: str, instance_id: str, job_id: str | None = None) -> dict[str, Any]:
    log.info("ec2 event ignored", extra={"instance_id": instance_id, "why": why, "job_id": job_id})
    return {"result": "ignored", "why": why, "instance_id": instance_id, "job_id": job_id}


def _ours(ctl: Controller, instance_id: str) -> tuple[Job, Node] | dict[str, Any]:
    found = current_node(ctl.store, instance_id)
    if found is None:
        return _ignored("not a spotrelay node", instance_id)
    job, node = found
    if job.status.terminal:
        return _ignored(f"job already {job.status.value}", instance_id, job.job_id)
    if node.attempt != job.attempt:
        return _ignored(f"node of attempt {node.attempt}; the job is on attempt {job.attempt}", instance_id, job.job_id)
    return job, node


def _directive_id(kind: str, instance_id: str, when: float) -> str:
    return f"{kind.lower()}-" + hashlib.sha256(f"{instance_id}:{when}".encode()).hexdigest()[:12]


def _spare(ctl: Controller, instance_id: str, state: NodeState,
           reclaim_at: float | None = None) -> dict[str, Any] | None:
    """A hot spare is out of training: a notice (EC2 takes it at ``reclaim_at``: released in its first
    hour, it is left to EC2) or a loss only takes it off the bench (the next provision launches
    another); the gang and the workflow are not touched."""
    found = current_node(ctl.store, instance_id)
    if found is None or not found[1].spare:
        return None
    job, node = found
    update: dict[str, Any] = {"state": state} if reclaim_at is None else {"state": state, "ec2_reclaim_at": reclaim_at}
    ctl.store.update_node(job.job_id, node.node_id, lambda n: n.model_copy(update=update)
                          if n.spare and n.state not in _GONE else None)
    return {"result": "applied", "job_id": job.job_id, "node_id": node.node_id, "node_state": state.value,
            "settled": None}


def interruption_notice(ctl: Controller, instance_id: str, notice_time: float, now: float) -> dict[str, Any]:
    benched = _spare(ctl, instance_id, NodeState.DOOMED, notice_time + NOTICE_LEAD_S)
    if benched is not None:
        return benched
    found = _ours(ctl, instance_id)
    if isinstance(found, dict):
        return found
    job, node = found
    # Every distinct notice counts against the pool (exact duplicates are deduplicated upstream),
    # even when the agent saw it first on IMDS and reported it (NoticeSeen does not count).
    ctl.pool_stats.record(node.pool.key, PoolEvent.INTERRUPTED, now)
    if node.state not in _GONE:
        ctl.measure("SpotNotices", 1)
    return _doom(ctl, job, node, notice_time, now)


def notice_seen(ctl: Controller, job: Job, node: Node, action_time: float | None, now: float) -> dict[str, Any]:
    """The agent saw the notice on IMDS (``NoticeSeen``): the same as the EC2 event, so either path
    alone is enough (same deadline, same directive id when both say the same time); the pool's
    interruption (and the SpotNotices metric) is counted by the EC2 event only."""
    if node.spare:
        reclaim = action_time if action_time is not None else now + NOTICE_LEAD_S
        return (_spare(ctl, node.instance_id, NodeState.DOOMED, reclaim)
                or _ignored("spare gone", node.instance_id, job.job_id))
    if node.attempt != job.attempt:
        return _ignored(f"node of attempt {node.attempt}; the job is on attempt {job.attempt}", node.instance_id,
                        job.job_id)
    reclaim = action_time if action_time is not None else now + NOTICE_LEAD_S
    return _doom(ctl, job, node, reclaim - NOTICE_LEAD_S, now)


def _doomed(node: Node, deadline: float) -> Node | None:
    """The record after EC2's notice: DOOMED with the reclaim as its deadline; a node a move or a
    health check doomed first keeps that deadline and learns EC2's (``ec2_reclaim_at``: released in
    its first hour, it is left to EC2, whose interruption is not billed). None: nothing to change."""
    if node.state not in (NodeState.EXITED, *_GONE) and node.reclaim_at is None:
        return node.model_copy(update={"state": NodeState.DOOMED, "reclaim_at": deadline, "ec2_reclaim_at": deadline})
    if node.ec2_reclaim_at is None and node.state is not NodeState.TERMINATED:
        return node.model_copy(update={"ec2_reclaim_at": deadline})
    return None


def _doom(ctl: Controller, job: Job, node: Node, notice_time: float, now: float) -> dict[str, Any]:
    instance_id = node.instance_id
    if node.state in _GONE:
        return _ignored(f"node already {node.state.value}; the attempt ended", instance_id, job.job_id)
    deadline = notice_time + NOTICE_LEAD_S
    ctl.store.update_node(job.job_id, node.node_id, lambda n: _doomed(n, deadline))
    directive = Directive(directive_id=_directive_id("checkpoint-now", instance_id, notice_time),
                          kind=DirectiveKind.CHECKPOINT_NOW, deadline=deadline, issued_at=now,
                          reason=f"spot interruption of {instance_id} (rank {node.rank})")
    sent = direct_nodes(ctl.store, job, directive)
    ctl.store.update_job(job.job_id, lambda j: j.model_copy(update={
        "status": transition(j.status, JobStatus.CHECKPOINTING), "updated_at": now})
        if j.status is JobStatus.RUNNING else None)
    # Before training started the ready wait ends here; with recovery.launch_at_notice the outcome
    # wait ends too, so recover launches the replacements while the ranks save (they drain).
    verdict = settle(ctl, job.job_id, now)
    log.info("interruption notice", extra={"job_id": job.job_id, "node_id": node.node_id, "deadline": deadline,
                                           "directives": sent})
    return {"result": "applied", "job_id": job.job_id, "node_id": node.node_id, "deadline": deadline,
            "directives": sent, "settled": verdict.outcome.value if verdict else None}


def rebalance(ctl: Controller, instance_id: str, event_time: float, now: float) -> dict[str, Any]:
    found = _ours(ctl, instance_id)
    if isinstance(found, dict):
        return found
    job, node = found
    if job.status is not JobStatus.RUNNING or node.state in (NodeState.DOOMED, *_GONE):
        return _ignored(f"job is {job.status.value}, node {node.state.value}: no proactive checkpoint",
                        instance_id, job.job_id)
    directive = Directive(directive_id=_directive_id("checkpoint", instance_id, event_time),
                          kind=DirectiveKind.CHECKPOINT, issued_at=now,
                          reason=f"rebalance recommendation for {instance_id} (rank {node.rank})")
    changed = ctl.store.update_job(job.job_id, lambda j: j.model_copy(update={
        "status": transition(j.status, JobStatus.CHECKPOINTING), "updated_at": now})
        if j.status is JobStatus.RUNNING else None)
    sent = direct_nodes(ctl.store, job, directive) if changed is not None else 0
    standby = changed is not None and request_standby(ctl, changed, node, now)  # the workflow launches it
    return {"result": "applied" if changed else "no-op", "job_id": job.job_id, "directives": sent,
            "standby": standby}


def _drained(ctl: Controller, instance_id: str) -> dict[str, Any] | None:
    """A rank of an earlier attempt left to drain after a notice is gone: TERMINATED, so the
    replacements waiting for it (agent ``wait_for_drain``) go on."""
    found = current_node(ctl.store, instance_id)
    if found is None:
        return None
    job, node = found
    if node.attempt >= job.attempt or node.release_after is None or node.state is NodeState.TERMINATED:
        return None
    ctl.store.update_node(job.job_id, node.node_id, lambda n: n.model_copy(update={"state": NodeState.TERMINATED})
                          if n.state is not NodeState.TERMINATED else None)
    return {"result": "applied", "job_id": job.job_id, "node_id": node.node_id, "node_state": "TERMINATED",
            "settled": None}


def instance_state(ctl: Controller, instance_id: str, state: str, now: float) -> dict[str, Any]:
    drained = _drained(ctl, instance_id) or _spare(ctl, instance_id, NodeState.TERMINATED)
    if drained is not None:
        return drained
    found = _ours(ctl, instance_id)
    if isinstance(found, dict):
        return found
    job, node = found
    if node.state in _GONE:
        return _ignored(f"node already {node.state.value}", instance_id, job.job_id)
    announced = node.state in (NodeState.DOOMED, NodeState.EXITED)
    target = NodeState.TERMINATED if announced else NodeState.LOST
    # an unannounced loss EC2 took: its reclaim time, so its first hour goes unbilled (the ledger)
    update = {"state": target, **({} if announced else unannounced_reclaim(ctl, node, now))}
    changed = ctl.store.update_node(job.job_id, node.node_id, lambda n: n.model_copy(update=update)
                                    if n.state not in _GONE else None)
    if changed is None:
        return _ignored("node changed meanwhile", instance_id, job.job_id)
    verdict = settle(ctl, job.job_id, now)
    log.info("instance going away", extra={"job_id": job.job_id, "node_id": node.node_id, "ec2_state": state,
                                           "node_state": target.value})
    return {"result": "applied", "job_id": job.job_id, "node_id": node.node_id, "node_state": target.value,
            "settled": verdict.outcome.value if verdict else None}
