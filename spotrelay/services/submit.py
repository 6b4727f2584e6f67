"""Submission by S3 drop: validate, record the job, start its workflow, or reject with reasons.

Every object under ``submissions/`` ends as a job that starts or as ``<key>.rejected.json`` naming
the cause, whatever it holds (empty, binary, hostile YAML, a wrong suffix) and whatever fails on the
way: an unexpected error is counted on the job (``submit_tries``) and re-raised, so the Lambda's
retries and reconcile's sweep (``heal_submissions``) try again; after ``MAX_TRIES`` the submission
is rejected (or, once validated, failed) with the error as the cause.

The job id derives from (key, etag), so a redelivered event maps to the same job: the create is
conditional and the execution is named after the job, so nothing starts twice. A job left half-way
(SUBMITTED, or VALIDATED without an execution) is finished by whoever sees it next. Dropping the
same file again at the same key (a new S3 sequencer, the same job) gets ``<key>.duplicate.json``
pointing at the existing job.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from spotrelay.contracts.workflow import WorkflowInput, WorkflowTimings
from spotrelay.domain.models import Job, job_id_for
from spotrelay.domain.status import JobStatus, transition
from spotrelay.errors import AlreadyExistsError, ConflictError, NotFoundError, PermanentError, SpecError
from spotrelay.ports.job_store import JobStore
from spotrelay.ports.notifier import Notifier
from spotrelay.ports.object_store import ObjectStore
from spotrelay.ports.workflow import Workflow
from spotrelay.resources import RESOURCES
from spotrelay.settings import settings
from spotrelay.spec.checks import (
    checkpoint_place_problems,
    dataset_place_problems,
    dropped_problems,
    fsx_problems,
    named_places_problems,
)
from spotrelay.spec.load import MAX_SPEC_BYTES, parse_spec, spec_hash, suffix_problem, training_hash
from spotrelay.spec.models import JobSpec

log = logging.getLogger(__name__)
REJECTED_SUFFIX = ".rejected.json"
DUPLICATE_SUFFIX = ".duplicate.json"
MAX_TRIES = 3  # unexpected failures before the submission ends with the error as its cause
_HALF_WAY = (JobStatus.SUBMITTED, JobStatus.VALIDATED)


@dataclass(frozen=True)
class SubmissionResult:
    outcome: str  # started | rejected | failed | duplicate | ignored
    job_id: str | None = None
    execution_arn: str | None = None
    reasons: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {"outcome": self.outcome, "job_id": self.job_id, "execution_arn": self.execution_arn,
                "reasons": list(self.reasons)}


@dataclass(frozen=True)
class Ports:
    store: JobStore
    objects: ObjectStore
    workflow: Workflow
    notifier: Notifier | None = None
    timings: WorkflowTimings | None = None


def is_submission(key: str) -> bool:
    """Under submissions/, not a folder marker, not one of our own reports beside a spec."""
    return (key.startswith(RESOURCES.submissions_prefix) and not key.endswith("/")
            and not key.endswith((REJECTED_SUFFIX, DUPLICATE_SUFFIX)))


def submit(key: str, etag: str, size: int | None, *, store: JobStore, objects: ObjectStore, workflow: Workflow,
           now: float, timings: WorkflowTimings | None = None, notifier: Notifier | None = None,
           sequencer: str | None = None) -> SubmissionResult:
    if not is_submission(key):
        return SubmissionResult("ignored")
    ports = Ports(store, objects, workflow, notifier, timings)
    job_id = job_id_for(key, etag)
    existing = store.find_job(job_id)
    if existing is None:
        job = Job(job_id=job_id, name=key.rsplit("/", 1)[-1], status=JobStatus.SUBMITTED, submission_key=key,
                  submission_etag=etag.strip('"'), submission_sequencer=sequencer, created_at=now, updated_at=now)
        try:
            store.create_job(job)
        except AlreadyExistsError:  # a concurrent delivery of the same event won the create
            return SubmissionResult("duplicate", job_id)
        return advance(job, ports, now, size)
    if _unfinished(existing):
        return advance(existing, ports, now, size)
    if sequencer is None or sequencer != existing.submission_sequencer:
        _report_duplicate(existing, key, objects)  # the same file dropped again, not a redelivery
    return SubmissionResult("duplicate", job_id, existing.execution_arn)


def _unfinished(job: Job) -> bool:
    return job.status is JobStatus.SUBMITTED or (job.status is JobStatus.VALIDATED and not job.execution_arn)


def advance(job: Job, ports: Ports, now: float, size: int | None = None) -> SubmissionResult:
    """Take a SUBMITTED or unstarted VALIDATED job as far as it goes: started, rejected or failed."""
    try:
        if job.status is JobStatus.SUBMITTED:
            try:
                spec = parse_spec(_read(job.submission_key, size, ports.objects), source=job.submission_key)
                if problems := _placement_problems(spec):
                    raise SpecError(job.submission_key, problems)
            except SpecError as exc:
                return _reject(job, exc.errors, ports, now)
            job = ports.store.save_job(job.model_copy(update={
                "status": transition(job.status, JobStatus.VALIDATED), "name": spec.name,
                "spec": spec.model_dump(mode="json"), "spec_hash": spec_hash(spec),
                "training_hash": training_hash(spec), "updated_at": now,
            }), JobStatus.SUBMITTED, job.version)
        return _start(job, ports)
    except ConflictError:  # another delivery moved the job meanwhile; it finishes the work
        return SubmissionResult("duplicate", job.job_id)
    except Exception as exc:
        return _failed_try(job, exc, ports, now)


def _placement_problems(spec: JobSpec) -> list[tuple[str, str]]:
    """What a dropped spec cannot have (local code), and places its nodes could not reach (S3, FSx)."""
    s = settings()
    return (dropped_problems(spec) + checkpoint_place_problems(spec, s.checkpoint_roots)
            + dataset_place_problems(spec, s.dataset_roots) + fsx_problems(spec, s.fsx_enabled)
            + named_places_problems(spec))


def _read(key: str, size: int | None, objects: ObjectStore) -> bytes:
    """The spec's bytes, or ``SpecError`` for what no retry can fix (suffix, size, gone)."""
    problem = suffix_problem(key)
    if problem is None and size is not None and size > MAX_SPEC_BYTES:
        problem = f"is {size} bytes; the limit is {MAX_SPEC_BYTES}"
    if problem is None and size == 0:
        problem = "is empty; a job spec is a mapping of fields"
    if problem is not None:
        raise SpecError(key, [("(file)", problem)])
    try:
        return objects.get(key, max_bytes=MAX_SPEC_BYTES)
    except NotFoundError as exc:
        raise SpecError(key, [("(file)", "was deleted before it could be read; drop it again")]) from exc
    except PermanentError as exc:  # larger than allowed (the event's size was missing)
        raise SpecError(key, [("(file)", f"cannot be used: {exc}")]) from exc


def _failed_try(job: Job, exc: Exception, ports: Ports, now: float) -> SubmissionResult:
    """Count an unexpected failure; re-raise it for a retry, or end the submission with it."""
    def count(current: Job) -> Job | None:
        if not _unfinished(current):
            return None
        return current.model_copy(update={"submit_tries": current.submit_tries + 1, "updated_at": now})

    try:
        counted = ports.store.update_job(job.job_id, count)
    except Exception:
        log.exception("cannot record a failed submission try", extra={"job_id": job.job_id})
        raise exc from None
    if counted is None:
        return SubmissionResult("duplicate", job.job_id)
    if counted.submit_tries < MAX_TRIES:
        log.warning("submission try failed; will retry", extra={"job_id": job.job_id, "tries": counted.submit_tries,
                                                                "error": repr(exc)})
        raise exc
    cause = f"{type(exc).__name__}: {exc}"[:400]
    errors = [("(controller)", f"failed {counted.submit_tries} times: {cause}; drop the file again or ask "
                               "the operator to check the controller's logs")]
    if counted.status is JobStatus.SUBMITTED:
        return _reject(counted, errors, ports, now)
    return _fail_validated(counted, errors, ports, now)


def _start(job: Job, ports: Ports) -> SubmissionResult:
    payload = WorkflowInput(job_id=job.job_id, timings=ports.timings or WorkflowTimings.from_env())
    arn = ports.workflow.start(job.job_id, payload.model_dump(mode="json"))

    def record(current: Job) -> Job | None:
        if current.execution_arn:
            return None
        return current.model_copy(update={"execution_arn": arn})

    ports.store.update_job(job.job_id, record)
    log.info("job started", extra={"job_id": job.job_id, "execution_arn": arn})
    if ports.notifier is not None:
        ports.notifier.notify("submitted", job.job_id, f"spotrelay: job {job.name} submitted",
                              {"job_id": job.job_id, "name": job.name, "execution_arn": arn})
    return SubmissionResult("started", job.job_id, arn)


def _write_report(key: str, job: Job, status: str, errors: list[tuple[str, str]], objects: ObjectStore) -> None:
    report = {"job_id": job.job_id, "key": key, "status": status,
              "errors": [{"field": path, "message": msg} for path, msg in errors]}
    objects.put(key + REJECTED_SUFFIX, json.dumps(report, indent=2).encode(), "application/json")


def _reject(job: Job, errors: list[tuple[str, str]], ports: Ports, now: float) -> SubmissionResult:
    key = job.submission_key
    reasons = [f"{path}: {msg}" for path, msg in errors]
    _write_report(key, job, "REJECTED", errors, ports.objects)  # first: a lost job write is retried, a report is not
    ports.store.save_job(job.model_copy(update={
        "status": transition(job.status, JobStatus.REJECTED), "reasons": reasons, "updated_at": now,
    }), JobStatus.SUBMITTED, job.version)
    log.info("job rejected", extra={"job_id": job.job_id, "reasons": reasons})
    if ports.notifier is not None:
        ports.notifier.notify("rejected", job.job_id, f"spotrelay: submission {key} rejected",
                              {"job_id": job.job_id, "key": key, "reasons": reasons})
    return SubmissionResult("rejected", job.job_id, None, tuple(reasons))


def _fail_validated(job: Job, errors: list[tuple[str, str]], ports: Ports, now: float) -> SubmissionResult:
    reasons = [f"{path}: {msg}" for path, msg in errors]
    _write_report(job.submission_key, job, "FAILED", errors, ports.objects)
    ports.store.save_job(job.model_copy(update={
        "status": transition(job.status, JobStatus.FAILED), "reasons": [*job.reasons, *reasons], "updated_at": now,
    }), JobStatus.VALIDATED, job.version)
    log.warning("validated job could not start", extra={"job_id": job.job_id, "reasons": reasons})
    if ports.notifier is not None:
        ports.notifier.notify("failed", job.job_id, f"spotrelay: job {job.name} could not start",
                              {"job_id": job.job_id, "key": job.submission_key, "reasons": reasons})
    return SubmissionResult("failed", job.job_id, None, tuple(reasons))


def _report_duplicate(job: Job, key: str, objects: ObjectStore) -> None:
    report = {"key": key, "duplicate_of": job.job_id, "status": job.status.value,
              "message": f"this file (same key, same content) was already submitted as job {job.job_id} "
                         f"({job.status.value}); to run it again, drop it under a new name or use "
                         "`spotrelay submit`, which names every upload uniquely"}
    try:
        objects.put(key + DUPLICATE_SUFFIX, json.dumps(report, indent=2).encode(), "application/json")
    except Exception:  # the job exists and is untouched; the note is a courtesy
        log.exception("cannot write the duplicate report", extra={"job_id": job.job_id})


def heal_submissions(ports: Ports, now: float, older_than_s: float = 180.0) -> list[str]:
    """Reconcile's part: finish SUBMITTED and unstarted VALIDATED jobs nobody finished."""
    healed = []
    for status in _HALF_WAY:
        for job in ports.store.jobs_by_status(status):
            if not _unfinished(job) or job.updated_at >= now - older_than_s or not job.submission_key:
                continue  # fresh, done, or not made from a dropped file (nothing to read again)
            try:
                result = advance(job, ports, now)
            except Exception as exc:  # counted on the job; the next sweep tries again
                log.warning("healing a submission failed", extra={"job_id": job.job_id, "error": repr(exc)})
                continue
            healed.append(f"{job.job_id}:{result.outcome}")
    return healed
