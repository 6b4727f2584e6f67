"""Stopping a running attempt after its ranks saved: ``spotrelay cancel --save`` and the budget.

``save_first`` records the pending stop on the job (``stop_save_by``: how long the save may take;
``stop_error``: what the workflow's waits get then) and gives every live rank CHECKPOINT_NOW without
a deadline (they save at the next step, wait for its global commit and exit 75; a deadline would let
them train on until just before it, as through a spot notice). While a stop is pending ``settle``
delivers no outcome verdict: the ranks' exits are the stop's, not an end to recover from. The waits
are failed with ``stop_error`` once every rank of the attempt exited or is gone (``finish_if_saved``,
on each TrainingExited), or by the reconcile sweep past ``stop_save_by`` (``finish_overdue``): the
workflow's Cancel path (JobCancelledError) or FailJob (BudgetExceededError) tears the job down, and
``spotrelay resume`` goes on from that save with nothing lost.
"""

from __future__ import annotations

import logging

from spotrelay.contracts.events import Directive, DirectiveKind
from spotrelay.domain.models import Job, NodeState
from spotrelay.errors import ConflictError, JobCancelledError
from spotrelay.ports.job_store import JobStore
from spotrelay.ports.workflow import Workflow
from spotrelay.services.controller import attempt_nodes, direct_nodes

log = logging.getLogger(__name__)
_DONE = (NodeState.EXITED, NodeState.LOST, NodeState.TERMINATED)
MAX_SAVE_S = 3600.0  # a save that takes longer than an hour is a hang: the sweep stops the job anyway


def save_first(store: JobStore, job: Job, now: float, error: str, reason: str, save_s: float) -> Job | None:
    """Record the pending stop and direct the ranks to save; the job as recorded, or None when no rank
    took the directive (nothing trains: stop now) or a stop is pending already."""
    marked = store.update_job(job.job_id, lambda j: j.model_copy(update={
        "stop_save_by": now + save_s, "stop_error": error, "stop_reason": reason, "updated_at": now})
        if j.stop_save_by is None else None)
    if marked is None:
        return None
    directive = Directive(directive_id=f"stop-{job.job_id}-a{marked.attempt}", kind=DirectiveKind.CHECKPOINT_NOW,
                          issued_at=now, reason=reason)
    if direct_nodes(store, marked, directive):
        return marked
    store.update_job(job.job_id, lambda j: j.model_copy(update={"stop_save_by": None}))  # nobody to save
    return None


def finish(store: JobStore, workflow: Workflow, job_id: str) -> bool:
    """Fail the job's waits with the pending stop's error (once: the claim clears the pending stop and
    takes the tokens)."""
    before: list[Job] = []

    def claim(j: Job) -> Job | None:
        if j.stop_save_by is None:
            return None
        before.append(j)
        return j.model_copy(update={"stop_save_by": None, "task_tokens": {}})

    if store.update_job(job_id, claim) is None:
        return False
    job = before[-1]
    for name, token in job.task_tokens.items():
        try:
            workflow.send_failure(token, job.stop_error or JobCancelledError.__name__, job.stop_reason or "stopped")
        except ConflictError:
            log.info("wait %s already ended", name, extra={"job_id": job_id})
    log.info("stopped after the save", extra={"job_id": job_id, "error": job.stop_error})
    return True


def finish_if_saved(store: JobStore, workflow: Workflow, job_id: str) -> bool:
    """On a rank's exit: once every rank of the attempt exited or is gone, the waits are failed."""
    job = store.get_job(job_id)
    if job.stop_save_by is None or not all(n.state in _DONE for n in attempt_nodes(store, job)):
        return False
    return finish(store, workflow, job_id)


def finish_overdue(store: JobStore, workflow: Workflow, job: Job, now: float) -> bool:
    """The reconcile sweep: a save past its deadline is not waited for any longer."""
    if job.stop_save_by is None or now < job.stop_save_by:
        return False
    log.warning("the save did not end by its deadline; stopping", extra={"job_id": job.job_id})
    return finish(store, workflow, job.job_id)
