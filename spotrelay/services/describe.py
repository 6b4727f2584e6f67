"""What happened to a job, for people: attempts, checkpoints, recoveries, anomalies, cost.

Pure assembly from the job record, its nodes and the checkpoint manifests in S3 (the caller reads
them); the CLI renders it as tables or ``--json``.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

from spotrelay.domain.advice import job_advice
from spotrelay.domain.cost import budget_reached_at, outlived_so_far, spent_at
from spotrelay.domain.models import AnomalyRecord, Attempt, Earlier, Job, Node
from spotrelay.errors import JobCancelledError
from spotrelay.placement.spot_evidence import SCHEDULE_GRACE_HOURS, progress, wall_limit
from spotrelay.ports.market import MarketData, PoolQuote
from spotrelay.ports.object_store import ObjectStore
from spotrelay.services import savings
from spotrelay.services.budget import draining_ranks, limits
from spotrelay.services.controller import spec_of, standing_by
from spotrelay.spec.models import JobSpec

log = logging.getLogger(__name__)


class _View(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AttemptView(_View):
    number: int
    pool: str | None
    instance_type: str | None
    market: str | None
    nodes: int
    instances: list[str]
    started_at: float | None
    ended_at: float | None
    end_reason: str | None
    resumed_from_step: int | None
    steps: int | None  # steps this attempt added to what the next one resumed from (or the job's last)
    reached_step: int | None = None  # the furthest step its ranks reported
    lost_steps: int | None = None  # its steps no checkpoint kept (counted in the job's steps_lost)
    exit_codes: dict[int, int | None]  # node rank -> exit code
    price_per_hour: float
    cost: float
    loss_interval_s: float | None = None  # placement's, for every_minutes: auto (why the trainers saved so often)


class CheckpointView(_View):
    step: int
    uri: str
    created: float | None = None
    bytes: int | None = None
    requested: bool = False  # saved for a request (notice, rebalance, replace-node), not on the cadence


class RecoveryView(_View):
    after_attempt: int
    reason: str | None
    stopped_at: float | None
    resumed_at: float | None
    downtime_s: float | None
    resumed_from_step: int | None


class CostLine(_View):
    attempt: int
    pool: str | None
    nodes: int
    hours: float
    # once closed, the price in effect over its life; while it runs, as last read (a budget's) or at launch
    price_per_hour: float
    cost: float
    running: bool = False  # still open: its cost is its clock so far at that price
    draining: int = 0  # its ranks still finishing its final save, billed: their cost so far is in ``cost``
    on_demand_cost: float | None = None  # its billed instance-hours at on-demand prices (None: no price known)
    unbilled: float = 0.0  # its clock's USD EC2 does not bill (instances it interrupted in their first hour)


class CostReport(_View):
    job_id: str
    total: float  # the closed attempts and the open one's clock (what the budget is checked against)
    budget: float | None
    lines: list[CostLine]
    budget_warned_at: float | None = None  # when people were told the budget is nearly spent
    budget_spent_at: float | None = None  # when the running attempt's clock reaches the budget (its rate now)
    on_demand: float | None = None  # every line's instance-hours at on-demand prices (None: one is unknown)
    saved: float | None = None  # 1 - the lines' cost / on_demand: spot savings as AWS counts them (the same usage)
    standby: float = 0.0  # rebalance standbys' own time charged so far (in ``total``, in no line)
    standing_by: int = 0  # standbys still waiting for a notice: billed, charged at their release or rank
    unbilled: float = 0.0  # the lines' ``unbilled``: left out of ``total`` (EC2's first-hour interruptions)
    # attempts folded out of the job record (services/history.py) and what they cost: in ``on_demand``,
    # ``saved``, ``unbilled`` and ``total``, in no line
    earlier_attempts: int = 0
    earlier_cost: float = 0.0


class JobReport(_View):
    job_id: str
    name: str
    status: str
    attempt: int
    last_step: int
    steps_lost: int
    recoveries: int
    reasons: list[str]
    attempts: list[AttemptView]
    checkpoints: list[CheckpointView]
    recoveries_detail: list[RecoveryView]
    anomalies: list[AnomalyRecord]
    cost: CostReport
    mlflow_run_id: str | None = None
    execution_arn: str | None = None
    stopping: str | None = None  # a pending stop (services/stop.py): why, and by when the ranks save
    advice: list[str] = []  # what the job's own history says a spec field would change (domain/advice.py)
    schedule: str | None = None  # recovery.max_slowdown: how far ahead of or behind its schedule the job is


def _hours(start: float | None, end: float | None, now: float) -> float:
    if start is None:
        return 0.0
    return max(0.0, (end if end is not None else now) - start) / 3600.0


def stopping(job: Job) -> str | None:
    """A pending stop in words: the ranks save, then the job ends (None when none is pending)."""
    if job.stop_save_by is None:
        return None
    by = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(job.stop_save_by))
    ends = "cancelled" if job.stop_error == JobCancelledError.__name__ else "failed"
    return f"stopping: the ranks save, then the job ends {ends} (by {by}): {job.stop_reason or '-'}"


# a job without recovery.max_slowdown whose committed training took this many times on-demand's wall time,
# over at least SLOW_ADVICE_HOURS since its submission (where the limit would count from), is told of the limit
SLOW_ADVICE_FACTOR = 1.5
SLOW_ADVICE_HOURS = 6.0


def _spec_and_quotes(job: Job, market: MarketData) -> tuple[JobSpec, list[PoolQuote]] | None:
    try:
        spec = spec_of(job)
    except ValueError:  # (a record whose stored spec no longer validates: nothing to say)
        return None
    res = spec.resources
    return spec, market.quotes(res.regions, res.instance_types, [m.value for m in res.markets], scores=False)


def schedule(job: Job, now: float, market: MarketData) -> str | None:
    """``recovery.max_slowdown`` in words: the job's committed training against its schedule
    (spot_evidence.WallLimit, with ``market``'s on-demand prices). None without the limit."""
    read = _spec_and_quotes(job, market)
    wall = wall_limit(read[0], job.created_at, job.earlier) if read else None
    if read is None or wall is None:
        return None
    standing = wall.standing(job.attempts, read[1], now)
    head = f"schedule (recovery.max_slowdown {wall.max_slowdown:g}):"
    if standing is None:
        return f"{head} not measured yet (no committed step, or no on-demand pool allowed)"
    behind, late = standing
    if behind <= 0:
        return f"{head} {-behind:.1f} h of on-demand training ahead"
    if not late:
        return (f"{head} {behind:.1f} h behind, within the grace ({SCHEDULE_GRACE_HOURS:g} h and the steps "
                "not saved yet)")
    return f"{head} {behind:.1f} h behind: its gang goes on on-demand until it is on schedule again"


def slowdown_advice(job: Job, now: float, market: MarketData) -> str | None:
    """``slowdown_line`` of the job record, with ``market``'s on-demand prices."""
    read = _spec_and_quotes(job, market)
    return None if read is None else slowdown_line(read[0], job.attempts, now, read[1], job.created_at, job.earlier)


def slowdown_line(spec: JobSpec, attempts: Sequence[Attempt], now: float, quotes: Sequence[PoolQuote],
                  since: float | None = None, earlier: Earlier | None = None) -> str | None:
    """One line for a job without ``recovery.max_slowdown`` that has spot attempts and whose committed
    training took ``SLOW_ADVICE_FACTOR`` or more times the wall time a full on-demand gang would have
    (``quotes``: the on-demand prices that pick the schedule's pool; ``since``: the job's submission, from
    which the limit's schedule would count). The simulator's runs say it too."""
    if spec.recovery.max_slowdown is not None:
        return None
    if not any(a.pool is not None and a.pool.market == "spot" for a in attempts) and not (
            earlier is not None and earlier.last_spot_end):
        return None
    measured = progress(attempts, quotes, now, spec.resources.nodes, since=since, earlier=earlier)
    if measured is None:
        return None
    elapsed, done, _ = measured  # (done: hours a full on-demand gang would have trained the committed steps in)
    if elapsed < SLOW_ADVICE_HOURS or elapsed < SLOW_ADVICE_FACTOR * done:
        return None
    ratio = f"{elapsed / done:.1f}x" if done > 0 else "more than"
    return (f"its committed training took {ratio} the wall time a full on-demand gang would have "
            f"({elapsed:.1f} h for {max(done, 0.0):.1f} h of it): recovery.max_slowdown keeps a job within a "
            "stated multiple of that, mixing on-demand in (docs/placement.md, \"A schedule\")")


def cost_report(job: Job, now: float, nodes: Iterable[Node] = ()) -> CostReport:
    """Per attempt and in total, on the job record's ledger; the open attempt counts its clock so far
    (domain/cost.py's ``spent_at``, the figure the budget is checked against). With the job's node
    records (``nodes``), a closed attempt's ranks still draining its save count what they have cost
    past its close so far, as the budget sweep counts them (their release charges it to the ledger)."""
    nodes = list(nodes)
    # (an ended job's attempts are closed; one a failure left open stopped costing when the job ended)
    current = job.attempts[-1] if job.attempts and not job.status.terminal else None
    ranks = draining_ranks(nodes) if current is not None else []  # (an ended job's teardown charged them)
    outlived = outlived_so_far(job.attempts, ranks, now)
    draining = Counter(number for number, _ in ranks)
    lines = []
    for a in job.attempts:
        running = a is current and a.ended_at is None and a.started_at is not None
        cost = spent_at(0.0, a, now) if running else a.cost + a.drain_cost  # (billed past its close too)
        cost += outlived.get(a.number, 0.0)
        od = savings.on_demand_cost(a, cost)
        lines.append(CostLine(attempt=a.number, pool=a.pool.key if a.pool else None, nodes=a.nodes,
                              hours=round(_hours(a.started_at, a.ended_at, now), 4), price_per_hour=a.billed_price(),
                              cost=round(cost, 4), running=running,
                              draining=draining[a.number] if a.ended_at is not None else 0,
                              on_demand_cost=None if od is None else round(od, 4),
                              unbilled=round(a.unbilled, 4)))
    budget, _ = limits(job)  # (as the reconcile sweep reads it: an odd record shows no budget)
    runs_out = budget_reached_at(job.cost_so_far, current, budget) if budget is not None else None
    total = spent_at(job.cost_so_far, current, now) + sum(outlived.values())
    on_demand = savings.total(line.on_demand_cost for line in lines)
    paid = sum(line.cost for line in lines)
    earlier = job.earlier
    if earlier is not None:  # (attempts folded out of the record: services/history.py)
        on_demand = None if on_demand is None or earlier.on_demand is None else on_demand + earlier.on_demand
        paid += earlier.paid
    return CostReport(job_id=job.job_id, total=round(total, 4), budget=budget,
                      lines=lines, budget_warned_at=job.budget_warned_at,
                      budget_spent_at=None if runs_out is None else round(runs_out, 1),
                      on_demand=None if on_demand is None else round(on_demand, 4),
                      # the attempts' hours alone (a prewarmed standby's cost is in the total, in no line)
                      saved=savings.saved_share(paid, on_demand),
                      standby=round(job.standby_cost, 4), standing_by=len(standing_by(nodes)) if current else 0,
                      unbilled=round(sum(a.unbilled for a in job.attempts) + (earlier.unbilled if earlier else 0.0), 4),
                      earlier_attempts=earlier.count if earlier else 0,
                      earlier_cost=round(earlier.paid, 4) if earlier else 0.0)


def checkpoint_location(job: Job, bucket: str, default_prefix: str) -> tuple[str, str]:
    """(bucket, key prefix) of the job's durable tier: the spec's ``s3_prefix`` or the jobs bucket's."""
    custom = ((job.spec.get("checkpoint") or {}).get("s3_prefix") if job.spec else None) or ""
    if custom:
        rest = custom.removeprefix("s3://").rstrip("/")
        other, _, key = rest.partition("/")
        return other, f"{key}/" if key else ""
    return bucket, f"{default_prefix}{job.job_id}/"


def checkpoints(objects: ObjectStore | None, prefix: str,
                unlisted: list[Exception] | None = None) -> list[CheckpointView]:
    """The committed checkpoints under ``prefix`` (a manifest exists), oldest first; [] when unreadable
    (``unlisted`` gets why: "none" and "could not look" read differently to a person)."""
    if objects is None:
        return []
    try:
        keys = [k for k in objects.list_keys(prefix) if k.endswith("/manifest.json")]
    except Exception as exc:  # describe must still answer without the bucket
        log.warning("cannot list checkpoints: %s", exc)
        if unlisted is not None:
            unlisted.append(exc)
        return []
    found = []
    for key in sorted(keys):
        try:  # a listing, not a resume: any format, read field by field; a bad one is skipped, named
            manifest: dict[str, Any] = json.loads(objects.get(key, max_bytes=4_000_000))
            shards = manifest.get("shards") or []
            size = sum(int(s.get("size", 0)) for s in shards) if isinstance(shards, list) else None
            found.append(CheckpointView(step=int(manifest.get("step", -1)), uri=key.rsplit("/", 1)[0] + "/",
                                        created=manifest.get("created"), bytes=size,
                                        requested=bool(manifest.get("request_id"))))  # fmt: skip
        except Exception as exc:
            log.warning("unreadable manifest %s: %s", key, exc)
            continue
    return sorted(found, key=lambda c: c.step)


def describe_job(job: Job, nodes: list[Node], now: float, ckpts: list[CheckpointView] | None = None,
                 market: MarketData | None = None) -> JobReport:
    """``market``: the on-demand prices ``schedule`` reads (none: no schedule line)."""
    costs = cost_report(job, now, nodes)
    cost_of = {line.attempt: line.cost for line in costs.lines}  # (the running attempt's clock so far)
    attempts: list[AttemptView] = []
    for i, a in enumerate(job.attempts):
        mine = sorted((n for n in nodes if n.attempt == a.number), key=lambda n: n.rank)
        following = job.attempts[i + 1] if i + 1 < len(job.attempts) else None
        reached = following.resumed_from_step if following is not None else job.last_step
        steps = None if reached is None else max(0, reached - (a.resumed_from_step or 0))
        attempts.append(AttemptView(
            number=a.number, pool=a.pool.key if a.pool else None,
            instance_type=a.pool.instance_type if a.pool else None, market=a.pool.market if a.pool else None,
            nodes=a.nodes or len(mine),
            instances=[n.instance_id for n in mine], started_at=a.started_at, ended_at=a.ended_at,
            end_reason=a.end_reason, resumed_from_step=a.resumed_from_step, steps=steps,
            reached_step=a.reached_step, lost_steps=a.lost_steps,
            exit_codes={n.rank: n.exit_code for n in mine}, price_per_hour=a.price_per_hour, cost=cost_of[a.number],
            loss_interval_s=a.loss_interval_s,
        ))  # fmt: skip
    recoveries = [
        RecoveryView(after_attempt=a.number, reason=a.end_reason, stopped_at=a.ended_at, resumed_at=b.started_at,
                     downtime_s=round(b.started_at - a.ended_at, 1) if a.ended_at and b.started_at else None,
                     resumed_from_step=b.resumed_from_step)
        for a, b in zip(job.attempts, job.attempts[1:], strict=False)
    ]  # fmt: skip
    return JobReport(
        job_id=job.job_id, name=job.name, status=job.status.value, attempt=job.attempt, last_step=job.last_step,
        steps_lost=job.steps_lost, recoveries=job.recoveries, reasons=list(job.reasons), attempts=attempts,
        checkpoints=ckpts or [], recoveries_detail=recoveries, anomalies=list(job.anomalies),
        cost=costs, mlflow_run_id=job.mlflow_run_id, execution_arn=job.execution_arn, stopping=stopping(job),
        advice=[*job_advice(job.spec, job.attempts),
                *([line] if market and (line := slowdown_advice(job, now, market)) else [])],
        schedule=schedule(job, now, market) if market else None,
    )  # fmt: skip
