"""``spotrelay resume JOB``: a stopped job (failed, cancelled) goes on from its newest checkpoint as a
new job, with the same spec pointed at the old job's durable tier.

Pure: the CLI reads the record, lists the checkpoints and uploads what this returns. The new job is
an ordinary submission (it is validated, placed and budgeted like any other); the agent resumes from
the newest committed checkpoint under ``checkpoint.s3_prefix``, which its training hash lets it use
(checkpoints.md: a raised budget or other regions change where and how it runs, not what it trains).
"""

from __future__ import annotations

from pydantic import ValidationError

from spotrelay.contracts.agent import RESUMED_FROM_TAG, RESUMED_RUN_TAG
from spotrelay.domain.models import Job
from spotrelay.domain.status import JobStatus
from spotrelay.errors import InvalidTransitionError
from spotrelay.spec.load import first_error, training_differences, training_hash
from spotrelay.spec.models import JobSpec


def resume_spec(job: Job, location: str, live: list[Job], budget: float | None = None,
                edited: JobSpec | None = None) -> JobSpec:
    """The spec of the job that continues ``job`` from ``location`` (its durable tier); ``budget``: the
    new job's own ``max_total_cost`` (else the spec's: it applies to the new job's spend alone);
    ``edited``: a spec to run instead of the stopped job's (other regions, types, cadence, retries,
    budget), whose training definition must be the stopped job's: its agent would refuse the checkpoints
    otherwise. ``InvalidTransitionError`` names why not: the job is still live, finished, rejected,
    another live job already writes to that location, or ``edited`` trains something else or saves
    elsewhere."""
    if job.status is JobStatus.SUCCEEDED:
        raise InvalidTransitionError(f"job {job.job_id} succeeded; nothing to resume (submit a new spec to "
                                     "train further)")
    if job.status is JobStatus.REJECTED or not job.spec:
        raise InvalidTransitionError(f"job {job.job_id} was rejected, it never trained; fix its spec and submit it")
    if not job.status.terminal:
        raise InvalidTransitionError(f"job {job.job_id} is {job.status.value}; cancel it first (two jobs must not "
                                     "write one checkpoint location)")
    try:
        stored: JobSpec | None = JobSpec.model_validate(job.spec)
    except ValidationError as exc:  # a record from an older release: the user's spec file is the way on
        if edited is None:
            field, msg = first_error(exc)
            raise InvalidTransitionError(f"job {job.job_id}'s stored spec no longer validates ({field}: {msg}); "
                                         "resume it with --spec FILE") from None
        stored = None
    trains = job.training_hash or (training_hash(stored) if stored is not None else "")
    if edited is not None:
        _check_edited(job, stored, trains, edited, location)
    spec = edited or stored
    assert spec is not None
    for other in live:
        ckpt = (other.spec.get("checkpoint") or {}) if other.spec else {}
        if other.job_id != job.job_id and (ckpt.get("s3_prefix") or "").rstrip("/") == location:
            raise InvalidTransitionError(f"job {other.job_id} ({other.status.value}) already resumes {job.job_id} "
                                         f"from {location}")
    doc = spec.model_dump(mode="json")
    doc["checkpoint"]["s3_prefix"] = location
    if budget is not None:
        doc["budget"]["max_total_cost"] = budget
    tags = {**doc["tracking"]["tags"], RESUMED_FROM_TAG: job.job_id}
    if job.mlflow_run_id:  # its agent continues that run: one loss curve (agent/tracking.py)
        tags[RESUMED_RUN_TAG] = job.mlflow_run_id
    doc["tracking"]["tags"] = tags
    resumed = JobSpec.model_validate(doc)  # (a bad budget is named by its field: budget.max_total_cost)
    assert training_hash(resumed) == training_hash(spec)  # (what lets the new job's agent resume it)
    return resumed


def _check_edited(job: Job, stored: JobSpec | None, trains: str, edited: JobSpec, location: str) -> None:
    """``edited`` trains what the stopped job trained (``trains``: its training hash; ``stored``: its
    spec, which names the fields that differ, when it still validates)."""
    if stored is None and (not trains or training_hash(edited) != trains):
        raise InvalidTransitionError(
            f"the spec trains something else than job {job.job_id} (its training definition differs; the stopped "
            "job's stored spec no longer validates to name the fields): its checkpoints would be refused")
    differs = training_differences(stored, edited) if stored is not None else []
    if differs:
        raise InvalidTransitionError(
            f"the spec trains something else than job {job.job_id} ({', '.join(differs)} differ): its checkpoints "
            "would be refused; keep those fields, or submit it as a new job")
    prefix = edited.checkpoint.s3_prefix
    if prefix is not None and prefix.rstrip("/") != location:
        raise InvalidTransitionError(f"checkpoint.s3_prefix: resume goes on from {location}, not {prefix}; "
                                     "leave it out of the spec")
