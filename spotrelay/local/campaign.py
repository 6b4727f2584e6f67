"""``spotrelay local chaos``: N jobs in the twin under seeded faults, then the verdict (docs/chaos.md).

The twin runs the real controller, agents and torch training; an :class:`~spotrelay.local.faults.Injector`
fires faults drawn from the seed while jobs train. When every job has ended (or the per-job timeout
passed: stuck) the campaign measures, from what the nodes and S3 left behind:

- ``checkpoints_lost``: an attempt resumed from an older step than the newest checkpoint an earlier
  attempt committed and the campaign did not break itself (or started from scratch despite one);
- ``duplicate_clusters``: one (job, attempt, rank) launched on more than one instance;
- ``instances_left``: instances still running after every job ended and reconcile ran;
- ``bit_identical``: succeeded jobs whose final model and optimizer state hash equals the
  uninterrupted reference run's;
- per fault, its downtime: from the fault to the first step of the job's next attempt.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from spotrelay.contracts.control import read_events
from spotrelay.local.faults import KINDS, NODE_FAULTS, Hit, Injector
from spotrelay.local.market import MarketModel
from spotrelay.local.reference import read_progress, read_results, start_reference
from spotrelay.local.twin import Twin, TwinOptions
from spotrelay.spec.load import parse_spec

ROOT = Path(__file__).resolve().parents[2]


MAX_JOB_TIMEOUT_S = 86400.0  # a day: past it a twin job is stuck, whatever its steps


@dataclass
class CampaignOptions:
    jobs: int = 4
    seed: int = 1
    faults: tuple[str, ...] = KINDS
    max_faults: int | None = None  # default: 2 per job
    parallel: int = 2  # jobs training at once
    steps: int = 40
    step_sleep_s: float = 0.2
    fault_every_s: tuple[float, float] = (4.0, 10.0)  # seconds between faults, drawn uniformly
    job_timeout_s: float = 600.0  # a job not ended this long after its submission is stuck
    cooldown_scale: float = 0.05  # pool cooldowns at this share of the shipped policy (see _scale_cooldowns)
    out: Path = Path("chaos-out")
    spec: Path = ROOT / "examples" / "tiny.yaml"

    def __post_init__(self) -> None:
        unknown = [k for k in self.faults if k not in KINDS]
        if unknown:
            raise ValueError(f"unknown fault kind(s) {', '.join(unknown)}; known: {', '.join(KINDS)}")
        for option, value in (("--jobs", self.jobs), ("--parallel", self.parallel), ("--steps", self.steps)):
            if value < 1:
                raise ValueError(f"{option} must be at least 1, not {value}")
        if self.max_faults is not None and self.max_faults < 0:
            raise ValueError("--max-faults must not be negative")
        if not 0 < self.job_timeout_s <= MAX_JOB_TIMEOUT_S:  # (NaN fails too) every job ends: in time or stuck
            raise ValueError(f"--job-timeout must be more than 0 and at most {MAX_JOB_TIMEOUT_S:.0f} seconds, "
                             f"not {self.job_timeout_s}")


@dataclass
class JobRecord:
    name: str
    job_id: str | None = None
    status: str = "NOT-STARTED"
    reason: str = ""
    attempts: int = 0
    submitted_at: float = 0.0
    ended_at: float | None = None
    faults: list[str] = field(default_factory=list)
    resumed_from: list[int] = field(default_factory=list)
    checkpoints_lost: int = 0
    bit_identical: bool | None = None
    spot_wait: str = "default"  # recovery.spot_wait_minutes: "default" (unset) or "0" (on-demand at once)
    plan_waits: int = 0  # times its workflow waited for a pool (PoolCooldown: for spot, or a cooldown's end)


def job_spec(options: CampaignOptions, wait_for_spot: bool = True) -> str:
    """The campaign's job. ``wait_for_spot``: ``recovery.spot_wait_minutes`` unset (the default wait
    for spot, up to 120 min of Plan's clock: 72 s at the twin's time scale); else 0 (on-demand at once)."""
    data = yaml.safe_load(options.spec.read_text())
    data["entrypoint"]["args"] = ["--engine", "ddp", "--steps", str(options.steps),
                                  "--step-sleep", str(options.step_sleep_s), "--out", "result"]
    data["checkpoint"]["every_steps"] = 5
    data["recovery"] = {"strategy": "replace-cluster", "max_recoveries": 12, "max_user_restarts": 4,
                        "retry_exit_codes": [77]}
    if not wait_for_spot:
        data["recovery"]["spot_wait_minutes"] = 0
    data.pop("tracking", None)
    data.pop("budget", None)
    text = yaml.safe_dump(data, sort_keys=False)
    parse_spec(text, source=str(options.spec))
    return text


def run_campaign(options: CampaignOptions, on_line: Any = print) -> dict[str, Any]:
    started = time.time()
    rng = random.Random(options.seed)
    out = options.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    spec_text = job_spec(options)  # even jobs wait for spot (the default), odd ones do not
    specs = {"default": spec_text, "0": job_spec(options, wait_for_spot=False)}
    reference = start_reference(parse_spec(spec_text), out / "reference", ROOT)
    market = MarketModel(regions=["us-east-1", "us-west-2"], boot_time_s=100, time_scale=0.01, notice_window_s=15)
    twin = Twin(TwinOptions(root=out / "twin", market=market, code_dir=ROOT, reconcile_every_s=5,
                            s3_mb_s=200.0, extra_env={"SPOTRELAY_STALE_HEARTBEAT_S": "40"})).start()
    _scale_cooldowns(options.cooldown_scale)
    injector = Injector(twin, rng)
    injector.install()
    records = [JobRecord(name=f"chaos-{options.seed}-{i}", spot_wait="0" if i % 2 else "default")
               for i in range(options.jobs)]
    hits: list[Hit] = []
    limit = options.max_faults if options.max_faults is not None else 2 * options.jobs
    try:
        _drive(twin, injector, records, hits, specs, options, limit, rng, on_line)
        instances_left = _settle(twin, injector)
        _count_plan_waits(records)
    finally:
        injector.reap(everything=True)
        twin.stop()
        _scale_cooldowns(None)
    if reference.wait(timeout=600) != 0:
        raise RuntimeError(f"the reference run failed; see {out / 'reference' / 'train.log'}")
    result = _verdict(twin, injector, records, hits, instances_left, read_results(out / "reference" / "result"),
                      options)
    result["wall_s"] = round(time.time() - started, 1)
    return result


def _scale_cooldowns(scale: float | None) -> None:
    """The campaign packs hours of faults into minutes (boot times run at 1/100); pool cooldowns of
    real minutes (15 after a capacity error, 30 after a notice) would then cool every pool at once
    and fail every job placed after a few faults. They run at ``scale`` of the shipped policy here, and so
    does the reclaim-wave window (separate faults seconds apart are separate waves at this pace)."""
    from functions import _runtime
    from spotrelay.adapters.dynamodb_pool_stats import DynamoDBPoolStatsStore
    from spotrelay.placement.cooldown import CooldownPolicy

    if scale is None:
        _runtime.set_factories(pool_stats=None)
        return
    shipped = CooldownPolicy()
    policy = CooldownPolicy(capacity_s=shipped.capacity_s * scale, interruption_s=shipped.interruption_s * scale,
                            quota_s=shipped.quota_s * scale, escalation=shipped.escalation,
                            max_s=shipped.max_s * scale, wave_s=shipped.wave_s * scale)
    _runtime.set_factories(pool_stats=lambda: DynamoDBPoolStatsStore(policy=policy))


def _drive(twin: Twin, injector: Injector, records: list[JobRecord], hits: list[Hit], specs: dict[str, str],
           options: CampaignOptions, limit: int, rng: random.Random, on_line: Any) -> None:
    from spotrelay.adapters.dynamodb_job_store import DynamoDBJobStore

    store = DynamoDBJobStore()
    keys: dict[str, str] = {}
    next_fault = time.time() + rng.uniform(*options.fault_every_s)
    while True:
        now = time.time()
        running = [r for r in records if r.submitted_at and r.ended_at is None]
        waiting = [r for r in records if not r.submitted_at]
        while waiting and len(running) < options.parallel:
            record = waiting.pop(0)
            keys[record.name] = twin.submit(specs[record.spot_wait], f"{record.name}.yaml")
            record.submitted_at = now
            running.append(record)
            on_line(f"submitted {record.name}")
        if not running and not waiting:
            return
        for record in running:
            job = twin.job_for_key(keys[record.name]) if record.job_id is None else store.find_job(record.job_id)
            if job is None:
                continue
            record.job_id, record.status, record.attempts = job.job_id, job.status.value, job.attempt
            record.reason = job.reasons[-1] if job.reasons else ""
            if job.status.terminal or now - record.submitted_at > options.job_timeout_s:
                record.ended_at = now
                on_line(f"{record.name}: {job.status.value} after {job.attempt} attempts {record.reason}".strip())
        live = {r.job_id for r in running if r.job_id and r.ended_at is None}
        if now >= next_fault and len(hits) < limit and live:
            kind = rng.choice(options.faults)
            hit = injector.fire(kind, live)
            if hit is not None:
                hits.append(hit)
                for record in records:
                    if hit.job_id is not None and record.job_id == hit.job_id:  # not the global faults
                        record.faults.append(kind)
                on_line(f"fault {len(hits)}/{limit}: {kind} {hit.job_id or ''} {hit.node or ''} {hit.detail}".rstrip())
                next_fault = now + rng.uniform(*options.fault_every_s)
            else:  # nothing to act on right now (no node training yet): draw again soon
                next_fault = now + 1.0
        injector.reap()
        time.sleep(0.5)


def _settle(twin: Twin, injector: Injector, ticks: int = 3, hang_s: float = 900.0) -> int:
    """Let reconcile run ``ticks`` times after the last job ended (counted, not timed: a loaded
    machine runs the schedule late); count the instances still alive."""
    assert twin.compute is not None and twin.dispatcher is not None
    injector._reconcile_paused_until = 0.0
    since = time.time()
    dispatcher = twin.dispatcher

    def reconciled() -> int:
        return sum(1 for d in list(dispatcher.deliveries) if "reconcile" in d.function and d.time >= since)

    while twin.compute.list_tagged([]) and reconciled() < ticks and time.time() < since + hang_s:
        time.sleep(1)
    return len(twin.compute.list_tagged([]))


def _count_plan_waits(records: list[JobRecord]) -> None:
    """How often each job's execution entered PoolCooldown (Plan's ``wait_s``), from its history."""
    from spotrelay.adapters.aws import client
    from spotrelay.adapters.dynamodb_job_store import DynamoDBJobStore

    store, sfn = DynamoDBJobStore(), client("stepfunctions")
    for record in records:
        job = store.find_job(record.job_id) if record.job_id else None
        if job is None or job.execution_arn is None:
            continue
        pages = sfn.get_paginator("get_execution_history").paginate(executionArn=job.execution_arn)
        record.plan_waits = sum(1 for page in pages for e in page["events"]
                                if e.get("stateEnteredEventDetails", {}).get("name") == "PoolCooldown")


def _node_events(twin: Twin, job_id: str) -> dict[int, list[Any]]:
    """Trainer events per attempt, from every node's control file. Each event names the attempt its
    trainer ran in; a node that served a later attempt than its launch tag says (a survivor, a
    promoted spare) files its events there."""
    assert twin.compute is not None
    by_attempt: dict[int, list[Any]] = {}
    for li in twin.compute.instances():
        if li.instance.job_id == job_id:
            events, _ = read_events(li.work_dir / "control")
            for e in events:
                by_attempt.setdefault(e.attempt or li.instance.attempt or 0, []).append(e)
    return by_attempt


def _first_steps(twin: Twin, job_id: str) -> dict[int, int]:
    """The first step each attempt trained (from the per-step loss files its ranks left); an attempt
    that never trained (stopped or lost before its first step) is absent."""
    assert twin.compute is not None
    first: dict[int, int] = {}
    for li in twin.compute.instances():
        if li.instance.job_id == job_id:
            for pairs in read_progress(li.work_dir / "result").values():
                if pairs:
                    attempt = li.instance.attempt or 0
                    first[attempt] = min(first.get(attempt, int(pairs[0][0])), int(pairs[0][0]))
    return first


def _verdict(twin: Twin, injector: Injector, records: list[JobRecord], hits: list[Hit], instances_left: int,
             reference: dict[int, dict[str, Any]], options: CampaignOptions) -> dict[str, Any]:
    assert twin.compute is not None
    launches: dict[tuple[str | None, int | None, int], int] = {}
    for li in twin.compute.instances():
        key = (li.instance.job_id, li.instance.attempt, li.instance.rank)
        launches[key] = launches.get(key, 0) + 1
    resumed_at: dict[tuple[str, int], float] = {}
    for record in records:
        if record.job_id is None:
            continue
        events = _node_events(twin, record.job_id)
        trained = _first_steps(twin, record.job_id)
        broken = injector.corrupted.get(record.job_id, set())
        committed: list[int] = []
        for attempt in sorted(events):
            resumes = [e for e in events[attempt] if e.kind == "resumed"]
            if attempt > 1 and (resumes or attempt in trained):  # an attempt that never trained resumed nothing
                step = min((e.step for e in resumes), default=0)
                record.resumed_from.append(step)
                valid = [s for s in committed if s not in broken]
                if valid and step < max(valid):
                    record.checkpoints_lost += 1
                if resumes:
                    resumed_at[(record.job_id, attempt)] = min(e.time for e in resumes)
            committed += [e.step for e in events[attempt] if e.kind == "checkpoint_committed"]
        if record.status == "SUCCEEDED":
            finals = [li for li in twin.compute.instances() if li.instance.job_id == record.job_id]
            results: dict[int, dict[str, Any]] = {}
            for li in finals:
                for rank, result in read_results(li.work_dir / "result").items():
                    if result.get("exit") == 0:
                        results[rank] = result
            record.bit_identical = bool(results) and all(
                results.get(rank, {}).get("state_sha256") == ref.get("state_sha256") for rank, ref in reference.items())
    faults = []
    for hit in hits:
        downtime = None
        if hit.kind in NODE_FAULTS and hit.job_id and hit.attempt:
            later = [t for (job, attempt), t in resumed_at.items() if job == hit.job_id and attempt > hit.attempt
                     and t >= hit.time]
            downtime = round(min(later) - hit.time, 1) if later else None
        faults.append({**asdict(hit), "downtime_s": downtime})
    succeeded = [r for r in records if r.status == "SUCCEEDED"]
    by_kind: dict[str, list[float]] = {}
    for f in faults:
        if f["downtime_s"] is not None:
            by_kind.setdefault(f["kind"], []).append(f["downtime_s"])
    return {
        "seed": options.seed,
        "shape": {"steps": options.steps, "parallel": options.parallel, "kinds": list(options.faults),
                  "max_faults": options.max_faults, "job_timeout_s": options.job_timeout_s},
        "jobs": len(records),
        "succeeded": len(succeeded),
        "failed": sum(r.status in ("FAILED", "CANCELLED", "REJECTED") for r in records),
        "stuck": sum(r.status not in ("SUCCEEDED", "FAILED", "CANCELLED", "REJECTED") for r in records),
        "failed_without_reason": sum(r.status in ("FAILED", "CANCELLED", "REJECTED") and not r.reason
                                     for r in records),
        "faults": len(hits),
        "faults_by_kind": {k: sum(h.kind == k for h in hits) for k in sorted({h.kind for h in hits})},
        "plan_waits": sum(r.plan_waits for r in records),
        "checkpoints_lost": sum(r.checkpoints_lost for r in records),
        "duplicate_clusters": sum(1 for n in launches.values() if n > 1),
        "instances_left": instances_left,
        "bit_identical": sum(bool(r.bit_identical) for r in succeeded),
        "downtime_s_by_kind": {k: {"n": len(v), "mean": round(sum(v) / len(v), 1), "max": max(v)}
                               for k, v in sorted(by_kind.items())},
        "records": [asdict(r) for r in records],
        "fault_log": faults,
    }


def write_json(result: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, default=str))
