"""Cancel a job: mark it CANCELLING and wake the workflow's waits so it tears the cluster down.

The workflow owns teardown (its catch-all always terminates instances). A job with no execution
yet (still SUBMITTED) has no cluster and goes straight to CANCELLED.

``save_s`` (``spotrelay cancel --save``): a RUNNING job's ranks save first (services/stop.py), so a
job stopped to change its settings loses no step and ``spotrelay resume`` goes on from that save.
Asked again with ``--save``, nothing changes; without it, the waits are woken now (the user does not
want to wait for the save any longer).
"""

from __future__ import annotations

import logging

from spotrelay.domain.models import Job
from spotrelay.domain.status import JobStatus, transition
from spotrelay.errors import ConflictError, InvalidTransitionError, JobCancelledError
from spotrelay.ports.job_store import JobStore
from spotrelay.ports.workflow import Workflow
from spotrelay.services.stop import MAX_SAVE_S, finish, save_first

log = logging.getLogger(__name__)
__all__ = ["MAX_SAVE_S", "request_cancel"]


def request_cancel(job_id: str, *, store: JobStore, workflow: Workflow, now: float, reason: str = "",
                   save_s: float | None = None) -> Job:
    """``save_s``: a RUNNING job's ranks save first, within that many seconds (else: at once, no save)."""
    if save_s is not None and not 0 < save_s <= MAX_SAVE_S:
        raise ValueError(f"the save may take above 0 and at most {MAX_SAVE_S:.0f} s (got {save_s:g})")
    why = reason or "cancelled by user"
    was: list[JobStatus] = []  # the status this call moved from (none: it was CANCELLING already)

    def change(job: Job) -> Job | None:
        if job.status is JobStatus.CANCELLING:
            return None  # already asked: idempotent
        if job.status.terminal:
            raise InvalidTransitionError(f"job {job_id} already ended as {job.status}")
        was[:] = [job.status]
        return job.model_copy(update={
            "status": transition(job.status, JobStatus.CANCELLING), "updated_at": now,
            "reasons": [*job.reasons, f"cancelled: {reason or 'by user'}"],
        })

    asked = store.update_job(job_id, change) is not None
    job = store.get_job(job_id)
    if not job.execution_arn:
        return _finish_without_cluster(job, store, now)
    if job.stop_save_by is not None:  # a save under way (a cancel's or the budget's): the cancel is how it ends
        if job.stop_error != JobCancelledError.__name__ or save_s is None:  # (ending now: this call's reason)
            job = store.update_job(job_id, lambda j: j.model_copy(update={
                "stop_error": JobCancelledError.__name__, "stop_reason": why})) or job
        if save_s is not None:
            return job  # wait for it
        finish(store, workflow, job_id)  # not waited for any longer
        return store.get_job(job_id)
    if asked and save_s is not None and was == [JobStatus.RUNNING]:
        saving = save_first(store, job, now, JobCancelledError.__name__, why, save_s)
        if saving is not None:
            return saving  # the ranks save; their exits (or the sweep at the deadline) wake the waits
    for name, token in job.task_tokens.items():
        try:
            workflow.send_failure(token, JobCancelledError.__name__, why)
        except ConflictError:
            log.info("wait %s already ended", name, extra={"job_id": job_id})
    return store.get_job(job_id)


def _finish_without_cluster(job: Job, store: JobStore, now: float) -> Job:
    done = job.model_copy(update={"status": transition(job.status, JobStatus.CANCELLED), "updated_at": now})
    return store.save_job(done, job.status, job.version)
