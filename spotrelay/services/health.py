"""Training-health findings from the agent (an ``Anomaly`` event carrying a ``HealthAnomaly``).

Every finding is recorded on the job (deduplicated by attempt, kind and step; the newest
``MAX_ANOMALIES`` kept) and announced. The session itself already rolled back or stopped; what
needs the controller is:

- ``replace-node``: the node at fault is doomed and every rank is told to checkpoint and stop,
  the same path as a spot notice, so recovery replaces that node (its instance is not reused);
- ``stop``: the reason goes on the job, so the FAILED record says which finding ended it.
"""

from __future__ import annotations

import logging
from typing import Any

from spotrelay.contracts.events import Anomaly, Directive, DirectiveKind
from spotrelay.contracts.health import HealthAction
from spotrelay.domain.models import MAX_ANOMALIES, AnomalyRecord, Job, Node, NodeState
from spotrelay.domain.status import JobStatus, transition
from spotrelay.services.controller import Controller, attempt_nodes, direct_nodes
from spotrelay.services.notify import announce

log = logging.getLogger(__name__)
# The node leaves at most this long after the doom: it marks the node as leaving (reclaim_at), so
# the end of the attempt counts it doomed even after it exits cleanly, like a noticed spot node.
REPLACE_SAVE_S = 300.0
_LIVE = (NodeState.PENDING, NodeState.READY, NodeState.RUNNING)


def on_health_anomaly(ctl: Controller, job: Job, node: Node, event: Anomaly, now: float) -> bool:
    """Record, announce and act; True when the job changed."""
    found = event.health
    if found is None:
        return False
    record = AnomalyRecord(attempt=event.attempt, node_id=node.node_id, kind=found.kind.value,
                           action=found.action.value, step=found.step, rank=found.rank,
                           detail=found.detail[:500], time=event.time)  # fmt: skip
    reason = f"health: {found.kind.value} at step {found.step} ({found.action.value}): {found.detail[:200]}"

    def keep(j: Job) -> Job | None:
        if any((a.attempt, a.kind, a.step) == (record.attempt, record.kind, record.step) for a in j.anomalies):
            return None  # a redelivered event
        update: dict[str, Any] = {"anomalies": [*j.anomalies, record][-MAX_ANOMALIES:], "updated_at": now}
        if found.action is HealthAction.STOP:
            update["reasons"] = [*j.reasons, reason]
        return j.model_copy(update=update)

    updated = ctl.store.update_job(job.job_id, keep)
    if updated is None:
        return False
    log.warning("training health", extra={"job_id": job.job_id, "kind": found.kind.value,
                                          "action": found.action.value, "step": found.step})
    ctl.measure("TrainingAnomalies", 1)
    announce(ctl.notifier, "anomaly", updated, now, reason=reason)
    if found.action is HealthAction.REPLACE_NODE:
        _replace(ctl, updated, found.node_rank if found.node_rank is not None else node.rank, reason, now)
    return True


def _replace(ctl: Controller, job: Job, node_rank: int, reason: str, now: float) -> None:
    nodes = attempt_nodes(ctl.store, job)
    target = next((n for n in nodes if n.rank == node_rank), None)
    if target is None or target.state not in _LIVE:
        log.info("replace-node: no live node of rank %d", node_rank, extra={"job_id": job.job_id})
        return
    ctl.store.update_node(job.job_id, target.node_id, lambda n: n.model_copy(update={
        "state": NodeState.DOOMED, "reclaim_at": now + REPLACE_SAVE_S}) if n.state in _LIVE else None)  # fmt: skip
    # No deadline: the ranks save and stop at once. With one, they would train on through it as
    # through a spot notice's window, at the straggler's pace, and the job could end before the swap.
    directive = Directive(directive_id=f"replace-{job.attempt}-{node_rank}", kind=DirectiveKind.CHECKPOINT_NOW,
                          deadline=None, issued_at=now, reason=f"replace node {node_rank}: {reason}")
    direct_nodes(ctl.store, job, directive)
    ctl.store.update_job(job.job_id, lambda j: j.model_copy(update={
        "status": transition(j.status, JobStatus.CHECKPOINTING), "updated_at": now})
        if j.status is JobStatus.RUNNING else None)  # fmt: skip
