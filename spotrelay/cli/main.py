"""``spotrelay``: submit, watch and cancel jobs; validate specs. Same CLI for AWS and the local twin."""

from __future__ import annotations

import json
import sys
import time
from typing import Annotated

import typer
from rich.console import Console

from spotrelay.cli.common import (
    BucketOpt,
    EndpointOpt,
    JobArg,
    JsonOpt,
    RegionOpt,
    SpecArg,
    TableOpt,
    check_spec_suffix,
    connect,
    submission_key,
)
from spotrelay.cli.errors import SpotrelayGroup, UsageProblem
from spotrelay.cli.tables import show

app = typer.Typer(help="Train on spot capacity without losing work.", no_args_is_help=True,
                  pretty_exceptions_enable=False, cls=SpotrelayGroup)
out = Console()
err = Console(stderr=True)

@app.command()
def validate(file: SpecArg) -> None:
    """Validate a job spec; exit 0 when good, 2 with every error when not."""
    from spotrelay.cli.code import local_code_dir
    from spotrelay.spec import load_spec

    check_spec_suffix(file)
    spec = load_spec(file)  # a SpecError is printed field by field, exit 2 (cli/errors.py)
    local_code_dir(spec, file)
    out.print(f"[green]ok[/] {file}: job '{spec.name}', {spec.resources.nodes} node(s)")


@app.command()
def schema() -> None:
    """Print the job spec's JSON Schema (point your editor's YAML plugin at it)."""
    from spotrelay.spec import JobSpec

    sys.stdout.write(json.dumps(JobSpec.model_json_schema(), indent=2) + "\n")


@app.command()
def submit(file: SpecArg, endpoint_url: EndpointOpt = None, bucket: BucketOpt = None, table: TableOpt = None,
           region: RegionOpt = None) -> None:
    """Validate locally, upload to the submissions prefix and print the job id."""
    from spotrelay.adapters.s3_object_store import S3ObjectStore
    from spotrelay.cli.code import local_code_dir, upload
    from spotrelay.domain.models import job_id_for
    from spotrelay.spec import load_spec
    from spotrelay.spec.load import read_spec_file

    check_spec_suffix(file)
    spec = load_spec(file)
    code_dir = local_code_dir(spec, file)
    connect(endpoint_url, bucket, table, region)
    body, suffix = read_spec_file(file), file.suffix
    if code_dir is not None:  # the spec goes up as JSON, naming the uploaded archive
        body, uri = upload(spec, file, code_dir)
        suffix = ".json"
        out.print(f"code {code_dir} uploaded as {uri}", highlight=False)
    key = submission_key(spec.name, suffix, time.time())
    etag = S3ObjectStore().put(key, body, "application/json" if suffix == ".json" else "application/yaml")
    job_id = job_id_for(key, etag)
    out.print(f"submitted [bold]{spec.name}[/] as s3 key {key}")
    sys.stdout.write(job_id + "\n")


@app.command()
def jobs(endpoint_url: EndpointOpt = None, table: TableOpt = None, region: RegionOpt = None,
         as_json: JsonOpt = False,
         status: Annotated[str | None, typer.Option(
             "--status", help="only these statuses, comma-separated, any case: running, failed, ... or "
             "active (not ended), ended")] = None,
         limit: Annotated[int | None, typer.Option("--limit", min=1, help="only the newest N")] = None) -> None:
    """List jobs, newest last."""
    from spotrelay.adapters.dynamodb_job_store import DynamoDBJobStore
    from spotrelay.cli.listing import parse_statuses, read_jobs
    from spotrelay.services.describe import cost_report

    statuses = parse_statuses(status) if status is not None else None  # (before anything is read)
    connect(endpoint_url, None, table, region)
    store = DynamoDBJobStore()
    every = store.all_jobs() if statuses is None else read_jobs(store, statuses)  # (all: a scan)
    found = every if limit is None else every[-limit:]
    if as_json:
        sys.stdout.write(json.dumps([j.model_dump(mode="json", exclude={"task_tokens", "spec"}) for j in found],
                                    indent=2) + "\n")
        return
    now, rows = time.time(), []
    for job in found:
        ckpt = f"step {job.last_checkpoint.step}" if job.last_checkpoint else "-"
        # a live job past its first attempt may have ranks draining a save: their nodes' cost so far counts
        drains = not job.status.terminal and any(a.ended_at is not None for a in job.attempts)
        report = cost_report(job, now, store.nodes_of(job.job_id) if drains else ())
        saved = "-" if report.saved is None else f"{report.saved:.0%}"  # against on-demand, the same hours
        rows.append([job.job_id, job.name, job.status.value, str(job.attempt), str(job.last_step), ckpt,
                     f"{report.total:.2f}", saved])  # (a running attempt: its clock so far)
    # ids are what every other command takes: never cut or wrapped (cli/tables.py), in every table
    show(out, ("job", "name", "status", "attempt", "step", "last checkpoint", "cost $", "saved"), rows)
    if len(found) < len(every):
        out.print(f"and {len(every) - len(found)} earlier jobs (--limit {limit})", highlight=False)


STATUS_ATTEMPTS = 10  # the newest attempts `status` lists (describe and cost list every kept one)


@app.command()
def status(job_id: JobArg, endpoint_url: EndpointOpt = None, table: TableOpt = None, region: RegionOpt = None,
           as_json: JsonOpt = False) -> None:
    """Show one job: status, its newest attempts, checkpoint, nodes, reasons."""
    from spotrelay.adapters.dynamodb_job_store import DynamoDBJobStore
    from spotrelay.cli.views import show_attempts, show_nodes
    from spotrelay.services.describe import cost_report, stopping

    connect(endpoint_url, None, table, region)
    store = DynamoDBJobStore()
    job = store.get_job(job_id)
    nodes = store.nodes_of(job_id)
    if as_json:
        sys.stdout.write(json.dumps({"job": job.model_dump(mode="json", exclude={"task_tokens"}),
                                     "nodes": [n.model_dump(mode="json") for n in nodes]}, indent=2) + "\n")
        return
    spent = cost_report(job, time.time(), nodes).total
    out.print(f"[bold]{job.name}[/] ({job.job_id}) [cyan]{job.status.value}[/] attempt {job.attempt}, "
              f"step {job.last_step}, recoveries {job.recoveries}, cost ${spent:.2f}")
    if job.last_checkpoint:
        out.print(f"last checkpoint: step {job.last_checkpoint.step} at {job.last_checkpoint.uri}")
    if (pending := stopping(job)) is not None:
        out.print(f"[yellow]{pending}[/]", highlight=False)
    for reason in job.reasons:
        out.print(f"  [yellow]{reason}[/]", markup=True, highlight=False)
    if job.attempts:
        show_attempts(out, job, nodes, newest=STATUS_ATTEMPTS)
    show_nodes(out, nodes, attempt=job.attempt)


@app.command()
def cancel(job_id: JobArg, endpoint_url: EndpointOpt = None, table: TableOpt = None, region: RegionOpt = None,
           reason: Annotated[str, typer.Option(help="recorded on the job")] = "",
           save: Annotated[bool, typer.Option("--save", help="a training job saves a checkpoint first")] = False,
           save_minutes: Annotated[float | None, typer.Option(
               "--save-minutes", help="with --save: how long the ranks may take (then it is torn down; "
                                      "default 10)")] = None,
           ) -> None:
    """Cancel a job; its workflow tears the cluster down (--save: after a checkpoint, for spotrelay resume)."""
    from spotrelay.adapters.dynamodb_job_store import DynamoDBJobStore
    from spotrelay.adapters.sfn_workflow import SfnWorkflow
    from spotrelay.services.cancel import MAX_SAVE_S, request_cancel

    if save_minutes is not None and not save:  # (it would be ignored: the teardown would not wait)
        raise UsageProblem("--save-minutes applies with --save only (the ranks save first, for that long at most)")
    save_minutes = 10.0 if save_minutes is None else save_minutes
    if save and not 0 < save_minutes * 60 <= MAX_SAVE_S:
        raise UsageProblem(f"--save-minutes: above 0 and at most {MAX_SAVE_S / 60:.0f} (got {save_minutes:g})")
    connect(endpoint_url, None, table, region)
    job = request_cancel(job_id, store=DynamoDBJobStore(), workflow=SfnWorkflow(), now=time.time(), reason=reason,
                         save_s=save_minutes * 60 if save else None)
    if job.stop_save_by is not None:
        by = time.strftime("%H:%M:%S UTC", time.gmtime(job.stop_save_by))
        out.print(f"{job.job_id}: {job.status.value}, saving first (by {by}); then torn down")
    else:
        out.print(f"{job.job_id}: {job.status.value}" + ("; nothing to save (not training)" if save else ""))


# Go on from a stopped job's newest checkpoint (spotrelay/cli/resume.py): `spotrelay resume JOB`.
from spotrelay.cli.resume import resume  # noqa: E402

app.command()(resume)

# What happened to a job (spotrelay/cli/inspect.py): `spotrelay describe|logs|cost JOB`.
from spotrelay.cli.inspect import cost, describe, logs  # noqa: E402

app.command()(describe)
app.command()(logs)
app.command()(cost)

# The local twin (spotrelay/cli/local.py): `spotrelay local up|interrupt|kill|nodes` and `spotrelay demo`.
from spotrelay.cli.local import demo, local_app  # noqa: E402

app.add_typer(local_app, name="local")
app.command("demo")(demo)

# The fleet simulator (spotrelay/cli/simulate.py, spotrelay/sim/).
from spotrelay.cli.simulate import simulate  # noqa: E402

app.command("simulate")(simulate)


def main() -> None:  # pragma: no cover - console entry point
    app()
