"""Cancel a job: mark it CANCELLING and wake the workflow's waits so it tears the cluster down.

The workflow owns teardown (its catch-all always terminates instances). A job with no execution
yet (still SUBMITTED) has no cluster and goes straight to CANCELLED.

``save_s`` (``spotrelay cancel --save``): a training job saves first. Every rank gets CHECKPOINT_NOW
without a deadline (they save at the next step, wait for its global commit and exit 75), and the job
record keeps how long that may take (``cancel_save_by``, ``save_s`` away); the waits are woken once every rank of
the attempt exited or is gone (``finish_if_saved``, on each TrainingExited), or by the reconcile
sweep once the deadline passed (``finish_overdue``). So a job stopped to change its settings loses
no step: ``spotrelay resume`` goes on from that save. Asked again with ``--save``, nothing changes;
without it, the waits are woken now (the user does not want to wait for the save any longer).
"""

from __future__ import annotations

import logging

from spotrelay.contracts.events import Directive, DirectiveKind
from spotrelay.domain.models import Job, NodeState
from spotrelay.domain.status import JobStatus, transition
from spotrelay.errors import ConflictError, InvalidTransitionError, JobCancelledError
from spotrelay.ports.job_store import JobStore
from spotrelay.ports.workflow import Workflow
from spotrelay.services.controller import attempt_nodes, direct_nodes

log = logging.getLogger(__name__)
_DONE = (NodeState.EXITED, NodeState.LOST, NodeState.TERMINATED)
MAX_SAVE_S = 3600.0  # a save that takes longer than an hour is a hang: the sweep tears it down


def request_cancel(job_id: str, *, store: JobStore, workflow: Workflow, now: float, reason: str = "",
                   save_s: float | None = None) -> Job:
    """``save_s``: a RUNNING job's ranks save first, within that many seconds (else: at once, no save)."""
    if save_s is not None and not 0 < save_s <= MAX_SAVE_S:
        raise ValueError(f"the save may take 0 to {MAX_SAVE_S:.0f} s (got {save_s:g})")

    def change(job: Job) -> Job | None:
        if job.status is JobStatus.CANCELLING:
            return None  # already asked: idempotent
        if job.status.terminal:
            raise InvalidTransitionError(f"job {job_id} already ended as {job.status}")
        saving = save_s is not None and job.status is JobStatus.RUNNING and bool(job.execution_arn)
        return job.model_copy(update={
            "status": transition(job.status, JobStatus.CANCELLING), "updated_at": now,
            "reasons": [*job.reasons, f"cancelled: {reason or 'by user'}" + ("; saving first" if saving else "")],
            "cancel_save_by": now + save_s if saving and save_s is not None else None,
        })

    asked = store.update_job(job_id, change) is not None
    job = store.get_job(job_id)
    if not job.execution_arn:
        return _finish_without_cluster(job, store, now)
    if job.cancel_save_by is not None:
        if not asked and save_s is not None:
            return job  # its save is under way: asked again, nothing changes (without --save: now)
        # no deadline: the ranks save at the next step and stop (one with a deadline trains on until
        # just before it, as through a spot notice); cancel_save_by bounds the wait on the controller's side
        directive = Directive(directive_id=f"cancel-{job_id}-a{job.attempt}", kind=DirectiveKind.CHECKPOINT_NOW,
                              issued_at=now, reason=reason or "cancelled by user")
        if asked and direct_nodes(store, job, directive):
            return job  # the ranks save; their exits (or the sweep at the deadline) wake the waits
    wake(store, workflow, job, reason)
    return store.get_job(job_id)


def wake(store: JobStore, workflow: Workflow, job: Job, reason: str = "") -> None:
    """Fail every wait of the job's execution with JobCancelledError: its Cancel path tears it down."""
    for name, token in job.task_tokens.items():
        try:
            workflow.send_failure(token, JobCancelledError.__name__, reason or "cancelled by user")
        except ConflictError:
            log.info("wait %s already ended", name, extra={"job_id": job.job_id})


def finish_if_saved(store: JobStore, workflow: Workflow, job_id: str) -> bool:
    """A cancel that saves first: wake the waits once every rank of the attempt exited or is gone."""
    job = store.get_job(job_id)
    if job.status is not JobStatus.CANCELLING or job.cancel_save_by is None or not job.task_tokens:
        return False
    if not all(n.state in _DONE for n in attempt_nodes(store, job)):
        return False
    wake(store, workflow, job)
    return True


def finish_overdue(store: JobStore, workflow: Workflow, job: Job, now: float) -> bool:
    """The reconcile sweep: a cancel's save that is past its deadline is not waited for any longer."""
    if job.status is not JobStatus.CANCELLING or job.cancel_save_by is None or not job.task_tokens:
        return False
    if now < job.cancel_save_by:
        return False
    log.warning("cancel: the save did not end by its deadline; tearing down", extra={"job_id": job.job_id})
    wake(store, workflow, job)
    return True


def _finish_without_cluster(job: Job, store: JobStore, now: float) -> Job:
    done = job.model_copy(update={"status": transition(job.status, JobStatus.CANCELLED), "updated_at": now})
    return store.save_job(done, job.status, job.version)
