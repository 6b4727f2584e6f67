"""Cancel a job: mark it CANCELLING and wake the workflow's waits so it tears the cluster down.

The workflow owns teardown (its catch-all always terminates instances). A job with no execution
yet (still SUBMITTED) has no cluster and goes straight to CANCELLED.
"""

from __future__ import annotations

import logging

from spotrelay.domain.models import Job
from spotrelay.domain.status import JobStatus, transition
from spotrelay.errors import ConflictError, InvalidTransitionError, JobCancelledError
from spotrelay.ports.job_store import JobStore
from spotrelay.ports.workflow import Workflow

log = logging.getLogger(__name__)


def request_cancel(job_id: str, *, store: JobStore, workflow: Workflow, now: float, reason: str = "") -> Job:
    def change(job: Job) -> Job | None:
        if job.status is JobStatus.CANCELLING:
            return None  # already asked: idempotent
        if job.status.terminal:
            raise InvalidTransitionError(f"job {job_id} already ended as {job.status}")
        return job.model_copy(update={
            "status": transition(job.status, JobStatus.CANCELLING), "updated_at": now,
            "reasons": [*job.reasons, f"cancelled: {reason or 'by user'}"],
        })

    store.update_job(job_id, change)
    job = store.get_job(job_id)
    if not job.execution_arn:
        return _finish_without_cluster(job, store, now)
    for name, token in job.task_tokens.items():
        try:
            workflow.send_failure(token, JobCancelledError.__name__, reason or "cancelled by user")
        except ConflictError:
            log.info("wait %s already ended", name, extra={"job_id": job_id})
    return store.get_job(job_id)


def _finish_without_cluster(job: Job, store: JobStore, now: float) -> Job:
    done = job.model_copy(update={"status": transition(job.status, JobStatus.CANCELLED), "updated_at": now})
    return store.save_job(done, job.status, job.version)
