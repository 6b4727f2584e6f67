"""``spotrelay describe | logs | cost``: what happened to a job, its training output, what it cost.

Every command that reads takes ``--json``. Errors are one line (``error: ...``): the app's
``SpotrelayGroup`` (cli/errors.py) turns whatever escapes into it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from spotrelay.cli.common import EndpointOpt, JobArg, JsonOpt, RegionOpt, TableOpt, connect
from spotrelay.cli.errors import UsageProblem
from spotrelay.cli.tables import show
from spotrelay.cli.views import folded_line
from spotrelay.ports.logs import LOG_GROUP_DEFAULT, LOG_GROUP_ENV

out = Console()
err = Console(stderr=True)

def _fail(message: object, code: int = 1) -> typer.Exit:
    err.print(f"[red]error:[/] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def _when(ts: float | None) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S") if ts else "-"


def _emit(model: Any) -> None:
    sys.stdout.write(json.dumps(model.model_dump(mode="json"), indent=2) + "\n")


def _load(job_id: str) -> tuple[Any, list[Any]]:
    from spotrelay.adapters.dynamodb_job_store import DynamoDBJobStore

    store = DynamoDBJobStore()
    # what fails here (no credentials, no network, no table, no job) becomes one line in cli/errors.py
    return store.get_job(job_id), store.nodes_of(job_id)


def describe(job_id: JobArg, endpoint_url: EndpointOpt = None, table: TableOpt = None, region: RegionOpt = None,
             as_json: JsonOpt = False) -> None:
    """Attempts (pool, nodes, times, end reason, steps, cost), checkpoints, recoveries, anomalies."""
    from spotrelay.adapters.s3_object_store import S3ObjectStore
    from spotrelay.adapters.static_market import StaticMarketData
    from spotrelay.resources import RESOURCES
    from spotrelay.services.describe import checkpoint_location, checkpoints, describe_job
    from spotrelay.settings import settings

    connect(endpoint_url, None, table, region)
    job, nodes = _load(job_id)
    bucket, prefix = checkpoint_location(job, settings().bucket, RESOURCES.checkpoints_prefix)
    # (the schedule's on-demand prices from the catalog: they move rarely, and describe asks EC2 nothing)
    report = describe_job(job, nodes, time.time(), checkpoints(S3ObjectStore(bucket), prefix), StaticMarketData())
    if as_json:
        _emit(report)
        return
    saved = f" (saved {report.cost.saved:.0%} against on-demand)" if report.cost.saved is not None else ""
    out.print(f"[bold]{report.name}[/] ({report.job_id}) [cyan]{report.status}[/] attempt {report.attempt}, "
              f"step {report.last_step}, steps lost {report.steps_lost}, cost ${report.cost.total:.2f}{saved}")
    for reason in report.reasons:
        out.print(f"  [yellow]{reason}[/]", highlight=False)
    if report.stopping:
        out.print(f"  [yellow]{report.stopping}[/]", highlight=False)
    for line in report.advice:
        out.print(f"  [green]advice:[/] {line}", highlight=False)
    if report.schedule:
        out.print(f"  {report.schedule}", highlight=False)
    show(out, ("attempt", "pool", "nodes", "started", "ended", "end reason", "from step", "steps", "cost $"),
         [[str(a.number), a.pool or "-", str(a.nodes), _when(a.started_at), _when(a.ended_at), a.end_reason or "-",
           str(a.resumed_from_step if a.resumed_from_step is not None else "-"),
           str(a.steps if a.steps is not None else "-"), f"{a.cost:.2f}"] for a in report.attempts], title="attempts")
    if report.cost.earlier_attempts:
        out.print(f"  {folded_line(report.cost.earlier_attempts, report.cost.earlier_cost)}", highlight=False)
    if report.recoveries_detail:
        show(out, ("after attempt", "reason", "downtime s", "resumed from step"),
             [[str(r.after_attempt), r.reason or "-", str(r.downtime_s if r.downtime_s is not None else "-"),
               str(r.resumed_from_step if r.resumed_from_step is not None else "-")] for r in report.recoveries_detail],
             title="recoveries")
    if report.checkpoints:
        show(out, ("step", "saved", "MB", "on request", "uri"),
             [[str(c.step), _when(c.created), f"{(c.bytes or 0) / 1e6:.1f}", "yes" if c.requested else "", c.uri]
              for c in report.checkpoints], title="checkpoints")
    if report.anomalies:
        show(out, ("attempt", "step", "kind", "action", "rank", "detail"),
             [[str(an.attempt), str(an.step), an.kind, an.action, str(an.rank) if an.rank is not None else "-",
               an.detail.splitlines()[0][:100] if an.detail else ""] for an in report.anomalies], title="anomalies")


def cost(job_id: JobArg, endpoint_url: EndpointOpt = None, table: TableOpt = None, region: RegionOpt = None,
         as_json: JsonOpt = False) -> None:
    """What the job has cost so far, per attempt, against its budget."""
    from spotrelay.services.describe import cost_report

    connect(endpoint_url, None, table, region)
    job, nodes = _load(job_id)
    report = cost_report(job, time.time(), nodes)
    if as_json:
        _emit(report)
        return
    rows = []
    for line in report.lines:
        state = " (running)" if line.running else f" ({line.draining} draining)" if line.draining else ""
        rows.append([f"{line.attempt}{state}", line.pool or "-", str(line.nodes), f"{line.hours:.3f}",
                     f"{line.price_per_hour:.2f}", f"{line.cost:.2f}",
                     "-" if line.on_demand_cost is None else f"{line.on_demand_cost:.2f}"])
    if report.earlier_attempts:  # (folded out of the job record: services/history.py)
        rows.insert(0, [f"1-{report.earlier_attempts} (folded)", "-", "-", "-", "-", f"{report.earlier_cost:.2f}", "-"])
    show(out, ("attempt", "pool", "nodes", "hours", "$/instance-h", "cost $", "on-demand $"), rows)
    if report.standby or report.standing_by:  # (in the total, in no attempt: services/prewarm.py)
        waiting = (f"; {report.standing_by} standing by, charged when released or when it takes a rank"
                   if report.standing_by else "")
        out.print(f"rebalance standbys: ${report.standby:.2f}{waiting}")
    if report.unbilled:  # (why an attempt costs less than its price x nodes x hours)
        out.print(f"not billed: ${report.unbilled:.2f} of the attempts' clocks, instances EC2 interrupted in "
                  "their first hour (EC2 bills none of it; left out of the costs above)")
    budget = f" of ${report.budget:.2f} budget ({report.total / report.budget:.0%})" if report.budget else ""
    warned = (f"; told it was nearly spent at {_when(report.budget_warned_at)} UTC"
              if report.budget_warned_at is not None else "")
    out.print(f"total ${report.total:.2f}{budget}{warned}")
    if report.on_demand:  # (what AWS's spot savings compare: the same instance-hours on on-demand)
        out.print(f"the same instance-hours on on-demand: ${report.on_demand:.2f} (saved {report.saved:.0%})")
    if report.budget_spent_at is not None:  # (a running attempt: the reconcile stops it then)
        left_h = max(0.0, report.budget_spent_at - time.time()) / 3600
        out.print(f"at the running attempt's rate the budget is spent at {_when(report.budget_spent_at)} UTC "
                  f"(in {left_h:.1f} h); the job stops then")


def logs(job_id: JobArg, attempt: Annotated[int | None, typer.Option(
             "--attempt", min=0, help="default: the latest")] = None,
         rank: Annotated[int | None, typer.Option("--rank", min=0, help="node rank; default: every node")] = None,
         follow: Annotated[bool, typer.Option("--follow", "-f", help="keep printing new lines")] = False,
         local_dir: Annotated[Path | None, typer.Option(
             "--dir", exists=True, file_okay=False, help="the twin's work dir (node files)")] = None,
         log_group: Annotated[str | None, typer.Option("--log-group", help="CloudWatch Logs group")] = None,
         endpoint_url: EndpointOpt = None, region: RegionOpt = None, as_json: JsonOpt = False) -> None:
    """The training output of a job's nodes: the twin's files (--dir), else CloudWatch Logs."""
    from spotrelay.ports.logs import TrainingLogs

    if local_dir is not None and not local_dir.is_dir():  # (click's file_okay refuses regular files only)
        raise UsageProblem(f"--dir {local_dir}: not a folder (the twin's work dir)")
    connect(endpoint_url, None, None, region)
    source: TrainingLogs
    if local_dir is not None:
        from spotrelay.adapters.file_logs import FileTrainingLogs

        source = FileTrainingLogs(local_dir)
    else:
        from spotrelay.adapters.cloudwatch_logs import CloudWatchTrainingLogs

        source = CloudWatchTrainingLogs(log_group or os.environ.get(LOG_GROUP_ENV) or LOG_GROUP_DEFAULT)
    streams = source.streams(job_id)  # failures read as one line through cli/errors.py
    if not streams:
        raise _fail(f"no training logs for job {job_id} yet")
    chosen = attempt if attempt is not None else max(s.attempt for s in streams)
    streams = [s for s in streams if s.attempt == chosen and (rank is None or s.rank == rank)]
    if not streams:
        raise _fail(f"no logs for attempt {chosen}" + (f" rank {rank}" if rank is not None else ""))
    cursors: dict[str, str | None] = {s.name: None for s in streams}
    while True:
        for s in streams:
            lines, cursors[s.name] = source.read(s, cursors[s.name])
            for line in lines:
                if as_json:
                    sys.stdout.write(json.dumps({"attempt": s.attempt, "rank": s.rank, "line": line}) + "\n")
                else:
                    sys.stdout.write((f"[a{s.attempt}-r{s.rank}] " if len(streams) > 1 else "") + line + "\n")
        sys.stdout.flush()
        if not follow:
            return
        time.sleep(1.0)
