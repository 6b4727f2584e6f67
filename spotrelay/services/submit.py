"""Submission by S3 drop: validate, record the job, start its workflow, or reject with reasons.

The job id derives from (key, etag), so a redelivered event maps to the same job: the create is
conditional and the execution is named after the job, so nothing starts twice. A crash between
"job recorded" and "execution started" is healed by the redelivery (VALIDATED without an
execution ARN starts it).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from spotrelay.contracts.workflow import WorkflowInput, WorkflowTimings
from spotrelay.domain.models import Job, job_id_for
from spotrelay.domain.status import JobStatus, transition
from spotrelay.errors import AlreadyExistsError, NotFoundError, SpecError
from spotrelay.ports.job_store import JobStore
from spotrelay.ports.notifier import Notifier
from spotrelay.ports.object_store import ObjectStore
from spotrelay.ports.workflow import Workflow
from spotrelay.resources import RESOURCES
from spotrelay.spec.load import MAX_SPEC_BYTES, parse_spec, spec_hash

log = logging.getLogger(__name__)
REJECTED_SUFFIX = ".rejected.json"
SPEC_SUFFIXES = (".yaml", ".yml", ".json")


@dataclass(frozen=True)
class SubmissionResult:
    outcome: str  # started | rejected | duplicate | ignored
    job_id: str | None = None
    execution_arn: str | None = None
    reasons: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {"outcome": self.outcome, "job_id": self.job_id, "execution_arn": self.execution_arn,
                "reasons": list(self.reasons)}


def is_submission(key: str) -> bool:
    return (
        key.startswith(RESOURCES.submissions_prefix)
        and not key.endswith(REJECTED_SUFFIX)  # our own rejection report lands beside the spec
        and key.endswith(SPEC_SUFFIXES)
    )


def submit(key: str, etag: str, size: int, *, store: JobStore, objects: ObjectStore, workflow: Workflow,
           now: float, timings: WorkflowTimings | None = None, notifier: Notifier | None = None) -> SubmissionResult:
    if not is_submission(key):
        return SubmissionResult("ignored")
    job_id = job_id_for(key, etag)
    existing = store.find_job(job_id)
    if existing is not None:
        if existing.status is JobStatus.VALIDATED and not existing.execution_arn:
            return _start(existing, store, workflow, timings, notifier)
        return SubmissionResult("duplicate", job_id, existing.execution_arn)

    job = Job(job_id=job_id, name=key.rsplit("/", 1)[-1], status=JobStatus.SUBMITTED, submission_key=key,
              submission_etag=etag.strip('"'), created_at=now, updated_at=now)
    try:
        store.create_job(job)
    except AlreadyExistsError:  # a concurrent delivery of the same event won the create
        return SubmissionResult("duplicate", job_id)

    try:
        if size > MAX_SPEC_BYTES:
            raise SpecError(key, [("(file)", f"is {size} bytes; the limit is {MAX_SPEC_BYTES}")])
        spec = parse_spec(objects.get(key, max_bytes=MAX_SPEC_BYTES), source=key)
    except (SpecError, NotFoundError) as exc:
        errors = exc.errors if isinstance(exc, SpecError) else [("(file)", str(exc))]
        return _reject(job, key, errors, store, objects, now, notifier)

    validated = job.model_copy(update={
        "status": transition(job.status, JobStatus.VALIDATED), "name": spec.name,
        "spec": spec.model_dump(mode="json"), "spec_hash": spec_hash(spec), "updated_at": now,
    })
    validated = store.save_job(validated, JobStatus.SUBMITTED, job.version)
    return _start(validated, store, workflow, timings, notifier)


def _start(job: Job, store: JobStore, workflow: Workflow, timings: WorkflowTimings | None,
           notifier: Notifier | None) -> SubmissionResult:
    payload = WorkflowInput(job_id=job.job_id, timings=timings or WorkflowTimings.from_env())
    arn = workflow.start(job.job_id, payload.model_dump(mode="json"))

    def record(current: Job) -> Job | None:
        if current.execution_arn:
            return None
        return current.model_copy(update={"execution_arn": arn})

    store.update_job(job.job_id, record)
    log.info("job started", extra={"job_id": job.job_id, "execution_arn": arn})
    if notifier is not None:
        notifier.notify("submitted", job.job_id, f"spotrelay: job {job.name} submitted",
                        {"job_id": job.job_id, "name": job.name, "execution_arn": arn})
    return SubmissionResult("started", job.job_id, arn)


def _reject(job: Job, key: str, errors: list[tuple[str, str]], store: JobStore, objects: ObjectStore,
            now: float, notifier: Notifier | None) -> SubmissionResult:
    reasons = [f"{path}: {msg}" for path, msg in errors]
    rejected = job.model_copy(update={
        "status": transition(job.status, JobStatus.REJECTED), "reasons": reasons, "updated_at": now,
    })
    store.save_job(rejected, JobStatus.SUBMITTED, job.version)
    report = {"job_id": job.job_id, "key": key, "status": "REJECTED",
              "errors": [{"field": path, "message": msg} for path, msg in errors]}
    objects.put(key + REJECTED_SUFFIX, json.dumps(report, indent=2).encode(), "application/json")
    log.info("job rejected", extra={"job_id": job.job_id, "reasons": reasons})
    if notifier is not None:
        notifier.notify("rejected", job.job_id, f"spotrelay: submission {key} rejected",
                        {"job_id": job.job_id, "key": key, "reasons": reasons})
    return SubmissionResult("rejected", job.job_id, None, tuple(reasons))
