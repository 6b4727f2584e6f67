"""``spotrelay resume JOB [--budget USD] [--spec FILE]``: go on from a stopped job's newest checkpoint as
a new job (services/resume.py), with its spec or an edited one that trains the same. Prints the new job
id on stdout, as ``submit`` does."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from spotrelay.cli.common import BucketOpt, EndpointOpt, JobArg, RegionOpt, TableOpt, given_path
from spotrelay.cli.errors import UsageProblem

if TYPE_CHECKING:
    from spotrelay.spec.models import JobSpec

out = Console()

BudgetOpt = Annotated[float | None, typer.Option(
    "--budget", help="the new job's budget.max_total_cost in USD (default: the old spec's, for the new job alone)")]


SpecOpt = Annotated[Path | None, typer.Option(
    "--spec", parser=given_path,
    help="run this spec instead (other regions, types, cadence, budget); it must train the same")]


def resume(job_id: JobArg, budget: BudgetOpt = None, spec_file: SpecOpt = None,
           endpoint_url: EndpointOpt = None, bucket: BucketOpt = None, table: TableOpt = None,
           region: RegionOpt = None) -> None:
    """Go on from a failed or cancelled job's newest checkpoint as a new job (same spec, or --spec; --budget)."""
    from pydantic import ValidationError

    from spotrelay.adapters.dynamodb_job_store import DynamoDBJobStore
    from spotrelay.adapters.s3_object_store import S3ObjectStore
    from spotrelay.cli.common import check_spec_suffix, connect, submission_key
    from spotrelay.domain.models import job_id_for
    from spotrelay.resources import RESOURCES
    from spotrelay.services.describe import checkpoint_location, checkpoints
    from spotrelay.services.resume import resume_spec
    from spotrelay.settings import settings
    from spotrelay.spec import load_spec
    from spotrelay.spec.load import first_error
    from spotrelay.spec.models import Budget

    if budget is not None:  # checked before anything is read: a bad amount is not a connection problem
        try:
            Budget(max_total_cost=budget)
        except ValidationError as exc:
            field, msg = first_error(exc)
            raise UsageProblem(f"--budget: budget.{field}: {msg}") from None
    edited = None
    if spec_file is not None:  # checked before anything is read or written: a bad file names itself
        check_spec_suffix(spec_file)
        edited = load_spec(spec_file)
    connect(endpoint_url, bucket, table, region)
    if edited is not None and spec_file is not None:
        edited = _with_code(edited, spec_file)
    store = DynamoDBJobStore()
    job = store.get_job(job_id)
    where, prefix = checkpoint_location(job, settings().bucket, RESOURCES.checkpoints_prefix)
    location = f"s3://{where}/{prefix}".rstrip("/")
    # a scan, not the by-status index: a job moving between two statuses while they were queried one by one
    # could be missed, and this check keeps one writer per checkpoint location (a resume is rare)
    live = [j for j in store.all_jobs() if not j.status.terminal]
    try:
        spec = resume_spec(job, location, live, budget, edited)
    except ValidationError as exc:  # (only --budget is validated there now: the specs were before)
        field, msg = first_error(exc)
        raise UsageProblem(f"--budget: {field}: {msg}") from None
    unlisted: list[Exception] = []
    saved = checkpoints(S3ObjectStore(where), prefix, unlisted)
    start = (f"from step {saved[-1].step} (its newest checkpoint)" if saved else
             f"from its newest checkpoint (they could not be listed here: {_why(unlisted[0])}; the new job's "
             "nodes read them with their own role)" if unlisted else "from step 0: no checkpoint was saved")
    key = submission_key(spec.name, ".json", time.time())
    body = json.dumps(spec.model_dump(mode="json"), indent=2).encode()  # (an explicit null stays null)
    etag = S3ObjectStore().put(key, body, "application/json")
    limit = spec.budget.max_total_cost
    out.print(f"resuming {job_id} {start}, checkpoints in {location}"
              + (f"; budget ${limit:,.2f} for the new job (the stopped one spent ${job.cost_so_far:,.2f})"
                 if limit is not None else ""), highlight=False, soft_wrap=True)
    sys.stdout.write(job_id_for(key, etag) + "\n")


def _why(exc: Exception) -> str:
    from spotrelay.adapters.aws import error_code

    return f"{error_code(exc) or type(exc).__name__}: {' '.join(str(exc).split())[:200]}"


def _with_code(spec: JobSpec, spec_file: Path) -> JobSpec:
    """A spec whose ``entrypoint.code`` is a local directory: uploaded as ``submit`` does, then named."""
    from spotrelay.cli.code import local_code_dir, upload
    from spotrelay.spec.load import parse_spec

    code_dir = local_code_dir(spec, spec_file)
    if code_dir is None:
        return spec
    body, uri = upload(spec, spec_file, code_dir)
    out.print(f"code {code_dir} uploaded as {uri}", highlight=False)
    return parse_spec(body, str(spec_file))
