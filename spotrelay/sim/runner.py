"""Run every policy on the same market and seeds, and reduce the runs to the contract's numbers."""

from __future__ import annotations

import gc
import json
import math
import random
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import ValidationError

from spotrelay.contracts.workflow import WorkflowTimings
from spotrelay.domain.advice import job_advice
from spotrelay.errors import validation_message
from spotrelay.services.describe import slowdown_line
from spotrelay.sim import billing
from spotrelay.sim.assumptions import assumptions
from spotrelay.sim.baselines import BASELINES, BaselineRun
from spotrelay.sim.bounds import MAX_RUNS
from spotrelay.sim.build import MarketOptions, build_market, trace_label
from spotrelay.sim.controller import SpotrelayRun
from spotrelay.sim.engine import Run
from spotrelay.sim.job import JobModel
from spotrelay.sim.losses import CATEGORIES, shares
from spotrelay.sim.moves import on_demand_quotes
from spotrelay.sim.switches import RunSwitches

# spotrelay switches that are spec fields: switch name -> the spec section that holds it
SPEC_SWITCHES = {"spares": "resources", "min_nodes": "resources", "wall_time_weight": "resources",
                 "launch_at_notice": "recovery", "prewarm_on_rebalance": "recovery", "prewarm_wait_s": "recovery",
                 "review_minutes": "recovery", "spot_wait_minutes": "recovery", "max_placing_minutes": "recovery",
                 "max_slowdown": "recovery",
                 "every_minutes": "checkpoint", "auto_min_minutes": "checkpoint", "auto_max_minutes": "checkpoint"}
# the job-run workflow's waits (WorkflowTimings, the execution's input) a sweep may change: loss_settle_s,
# backoff_s, ... (not time_scale: the twin's clock)
TIMING_SWITCHES = tuple(name for name in WorkflowTimings.model_fields if name != "time_scale")
# every spotrelay switch the CLI's --switch NAME=VALUE takes (SimOptions.spotrelay_switches)
SWITCHES = ("strategy", *SPEC_SWITCHES, "rebalance_checkpoint", "keep_margin", *TIMING_SWITCHES)


def parse_switch(text: str) -> tuple[str, Any]:
    """``NAME=VALUE`` (VALUE as JSON: 1, 0.2, true; else a string) -> (name, value); ValueError names it."""
    name, sep, raw = text.partition("=")
    name = name.strip().replace("-", "_")
    if not sep or name not in SWITCHES:
        raise ValueError(f"--switch {text!r}: expected NAME=VALUE with NAME one of {', '.join(SWITCHES)}")
    try:
        return name, json.loads(raw)
    except json.JSONDecodeError:
        return name, raw.strip()


Progress = Callable[[int], None]  # told how many more runs of a sweep are done
POLICIES = ("spotrelay", "on-demand", "skypilot-like", "sagemaker-like", "price-limit")
VARIANT_PREFIX = "spotrelay:"  # a variant's policy name is this and its own (SimOptions.variants)
METRICS = ("cost_usd", "transfer_usd", "useful_gpu_hours", "cost_per_useful_gpu_hour", "goodput", "wall_hours",
           "steps_lost", "interruptions", "recoveries", "recovery_s_p50", "recovery_s_p95", "on_demand_share",
           "captured_saving")


@dataclass
class SimOptions:
    market: MarketOptions = field(default_factory=MarketOptions)
    job: JobModel = field(default_factory=JobModel)
    policies: tuple[str, ...] = POLICIES
    seeds: int = 1
    jobs: int = 1  # independent jobs per seed (each starts at its own seeded time)
    spotrelay_switches: dict[str, Any] = field(default_factory=dict)  # variants: strategy, rebalance, ...
    timeline: bool = False
    workers: int = 1  # processes for the runs (sim/parallel.py); 1: in this process. Same report for any
    # spotrelay's variants run beside it (sim/variants.py): policy name "spotrelay:NAME" -> its switches, over
    # ``spotrelay_switches``; each is also in ``policies``
    variants: dict[str, dict[str, Any]] = field(default_factory=dict)



@dataclass
class RunResult:
    policy: str
    seed: int
    values: dict[str, float]
    finished: bool
    events: int
    timeline: list[tuple[float, str, str]]
    decisions: list[dict[str, Any]]
    losses: dict[str, float] = field(default_factory=dict)  # share of paid GPU-hours per phase (sim/losses.py)
    failed: str | None = None  # why a run did not finish (the stall budget, the horizon, no pool holds it)
    advice: str | None = None  # what ``spotrelay describe`` would tell people of its attempts (domain/advice.py)
    jobs: int = 1  # the jobs it sums (``--jobs``: one seed's are summed per policy)
    advised: int = 0  # of those, the jobs with ``advice``


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


# a run's clock stops at this many times its job's work (and a month): far past any run that makes
# progress (a 16-node gang on the g4dn trace takes 2.3x its work, an elastic one at 32 nodes 4.7x; at
# twice, 10-month jobs on the trace were cut off unfinished), finite for one that never starts
HORIZON_JOBS = 6


def make_run(policy: str, opts: SimOptions, market: Any, seed: int, start_t: float) -> Run:
    # a policy that cannot finish by then gives up: HORIZON_JOBS times the job's length and a month
    horizon = HORIZON_JOBS * opts.job.job_hours * 3600.0 + 30 * 86400.0
    common: dict[str, Any] = {"start_t": start_t, "timeline": opts.timeline, "horizon_s": horizon}
    regions, types = opts.market.regions, opts.market.instance_types
    if opts.job.checkpoint_region is None and regions:  # the home region's jobs bucket (JobModel)
        opts = replace(opts, job=replace(opts.job, checkpoint_region=regions[0]))
    if policy == "spotrelay" or policy in opts.variants:
        switches = {**opts.spotrelay_switches, **opts.variants.get(policy, {})}
        job = replace(opts.job, strategy=switches.pop("strategy", opts.job.strategy))
        overrides: dict[str, dict[str, Any]] = {}
        for name, section in SPEC_SWITCHES.items():
            if name in switches:
                overrides.setdefault(section, {})[name] = switches.pop(name)
        if overrides:
            switches["spec_overrides"] = overrides
        timed = {name: switches.pop(name) for name in TIMING_SWITCHES if name in switches}
        plain = {name: switches.pop(name) for name in RunSwitches.model_fields if name in switches}
        try:
            switches.update(RunSwitches.model_validate(plain).model_dump(exclude_unset=True))
            if timed:
                switches["timings"] = WorkflowTimings.model_validate(timed)
            run: Run = SpotrelayRun(market, job, seed, regions=regions, instance_types=types, **switches, **common)
        except ValidationError as exc:  # a switch the spec or the timings refuse: name it (the CLI prints one line)
            first = exc.errors()[0]
            field_name = ".".join(str(p) for p in first["loc"])
            named = "" if policy == "spotrelay" else f"--variant {policy.removeprefix(VARIANT_PREFIX)}: "
            # a check of a whole section (min_nodes against nodes) names the section: say the switches given in it
            given = ", ".join(overrides.get(field_name, {})) or field_name.rsplit(".", 1)[-1]
            raise ValueError(f"{named}switch {given}: {field_name}: {validation_message(first)}") from None
    elif policy in BASELINES:
        # the bound keeps its checkpoints where it trains: it sends none between regions
        job = replace(opts.job, transfer_usd_per_gb=0.0) if policy == "price-limit" else opts.job
        run = BaselineRun(market, job, seed, policy=policy, regions=regions, instance_types=types, **common)
    else:
        raise ValueError(f"unknown policy '{policy}'; known: {', '.join(POLICIES)}")
    return run


def measure(policy: str, seed: int, run: Run) -> RunResult:
    end = run.now
    transfer = run.transfer_gb * run.job.transfer_usd_per_gb  # checkpoints across regions (sim/training.py)
    cost = billing.billed_usd(run.entries, end) + transfer  # (the ledger's cost_so_far, each entry once)
    useful = run.useful_gpu_hours()
    paid = run.paid_gpu_s / 3600.0
    m = run.metrics
    values = {
        "cost_usd": cost, "transfer_usd": transfer, "useful_gpu_hours": useful,
        "cost_per_useful_gpu_hour": cost / useful if useful > 0 else math.inf,
        "goodput": useful / paid if paid > 0 else 0.0, "wall_hours": (end - run.start_t) / 3600.0,
        "steps_lost": float(m.steps_lost), "interruptions": float(m.interruptions),
        "recoveries": float(m.recoveries), "recovery_s_p50": percentile(m.recovery_s, 0.5),
        "recovery_s_p95": percentile(m.recovery_s, 0.95),
        "on_demand_share": run.od_gpu_s / run.paid_gpu_s if run.paid_gpu_s else 0.0,
        "cross_region_moves": float(m.cross_region_moves), "capacity_failures": float(m.capacity_failures),
        # physics check, kept as a guard: more useful than paid GPU-hours means the simulator trained
        # a gang it did not bill (the gap once seen in notice-window runs: a kept survivor EC2 had taken
        # was revived, fixed in a9b62eb), and a gang that reported ready short of ranks (it would hang
        # at its rendezvous); flagged in the JSON, the table and bench/economics.py
        "deadline_cut": 1.0 if m.deadline_cut else 0.0,  # (JobModel.deadline_hours stopped it short)
        "inconsistent": 1.0 if useful > paid * 1.000001 + 1e-9 or int(getattr(run, "short_starts", 0)) else 0.0,
    }
    return RunResult(policy, seed, values, m.finished, m.events, m.timeline,
                     list(getattr(run, "decisions", [])), shares(run),
                     None if m.finished else m.failed_reason or "did not finish", advice := _advice(run),
                     advised=int(advice is not None))


def _advice(run: Run) -> str | None:
    """describe's advice over the run's job record (spotrelay's runs keep one; the baselines none), at the
    run's end, with its market's on-demand prices then."""
    spec, attempts = getattr(run, "spec", None), getattr(run, "attempts", None)
    if spec is None or not attempts:
        return None
    said = job_advice(spec.model_dump(mode="json"), attempts)
    if line := slowdown_line(spec, attempts, run.now, on_demand_quotes(run),
                             getattr(run, "created_at", None)):
        said.append(line)
    return "; ".join(said) or None


def job_starts(seed: int, jobs: int) -> list[float]:
    """Each job's start on seed ``seed``'s market (its own seeded time in the first week)."""
    return [random.Random(f"{seed}/start/{j}").uniform(0, 7 * 86400.0) for j in range(jobs)]


# A run allocates millions of short-lived objects (events, quotes, records) beside a long-lived heap
# (the market's slots, the quote caches, the run's nodes): with the collector's default (a young
# collection every 700 allocations) collections were a fifth of a run's CPU. A run has no garbage
# cycles of its own, and the one it leaves (the run and its walker refer to each other) is broken
# when it is measured (Run.dispose): rarer collections cost no memory.
GC_YOUNG_THRESHOLD = 100_000


@contextmanager
def _rare_collections() -> Iterator[None]:
    """The collector's young threshold at least ``GC_YOUNG_THRESHOLD`` while a run runs."""
    old = gc.get_threshold()
    gc.set_threshold(max(old[0], GC_YOUNG_THRESHOLD), *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)


def run_one(opts: SimOptions, market: Any, policy: str, seed: int, job: int, start: float) -> RunResult:
    """One job of one policy: independent of every other run (its random state is its own)."""
    run = make_run(policy, opts, market, seed * 1000 + job, start)
    with _rare_collections():
        run.start()  # type: ignore[attr-defined]
        run.loop()
        result = measure(policy, seed, run)
        run.dispose()  # before the collector's threshold drops: its next collection scans a small heap
    return result


def merge_seed(per_policy: list[list[RunResult]]) -> list[RunResult]:
    """One seed's runs, a list of jobs per policy, summed per policy (in order) with the captured saving."""
    out = [parts[0] if len(parts) == 1 else _sum(parts) for parts in per_policy]
    _captured(out)
    return out


def run_seed(opts: SimOptions, seed: int, progress: Progress | None = None) -> list[RunResult]:
    """Every policy on seed ``seed``'s market, ``opts.jobs`` jobs each (summed per policy); ``progress``
    is told of each run done."""
    market = build_market(opts.market, seed)
    starts = job_starts(seed, opts.jobs)
    per_policy = []
    for policy in opts.policies:
        jobs = []
        for j, start in enumerate(starts):
            jobs.append(run_one(opts, market, policy, seed, j, start))
            if progress is not None:
                progress(1)
        per_policy.append(jobs)
    return merge_seed(per_policy)


def _sum(parts: list[RunResult]) -> RunResult:
    add = ("cost_usd", "transfer_usd", "useful_gpu_hours", "wall_hours", "steps_lost", "interruptions", "recoveries",
           "cross_region_moves", "capacity_failures", "inconsistent")
    values = {k: sum(p.values[k] for p in parts) for k in add}
    values["cost_per_useful_gpu_hour"] = (values["cost_usd"] / values["useful_gpu_hours"]
                                          if values["useful_gpu_hours"] else math.inf)
    for k in ("goodput", "recovery_s_p50", "recovery_s_p95", "on_demand_share", "deadline_cut"):
        values[k] = statistics.fmean(p.values[k] for p in parts)
    losses = {c: statistics.fmean(p.losses.get(c, 0.0) for p in parts) for c in CATEGORIES
              if any(c in p.losses for p in parts)}
    return RunResult(parts[0].policy, parts[0].seed, values, all(p.finished for p in parts),
                     sum(p.events for p in parts), parts[0].timeline, parts[0].decisions, losses,
                     next((p.failed for p in parts if p.failed), None),
                     next((p.advice for p in parts if p.advice), None), sum(p.jobs for p in parts),
                     sum(p.advised for p in parts))


def _captured(results: list[RunResult]) -> None:
    by = {r.policy: r.values["cost_per_useful_gpu_hour"] for r in results}
    od, pl = by.get("on-demand"), by.get("price-limit")
    for r in results:
        ok = od is not None and pl is not None and od > pl and math.isfinite(od)
        r.values["captured_saving"] = (od - r.values["cost_per_useful_gpu_hour"]) / (od - pl) if ok else math.nan  # type: ignore[operator]
        r.values["vs_on_demand"] = r.values["cost_per_useful_gpu_hour"] / od if od else math.nan
        r.values["vs_price_limit"] = r.values["cost_per_useful_gpu_hour"] / pl if pl else math.nan


@dataclass
class Report:
    nodes: int
    seeds: int
    trace: str
    runs: list[RunResult]
    seconds: float
    assumptions: dict[str, Any] = field(default_factory=dict)  # sim/assumptions.py: stated with the result

    @property
    def events(self) -> int:
        return sum(r.events for r in self.runs)

    def policies(self) -> list[str]:
        return list(dict.fromkeys(r.policy for r in self.runs))

    def series(self, policy: str, metric: str) -> list[float]:
        return [r.values[metric] for r in self.runs if r.policy == policy]

    def mean(self, policy: str, metric: str) -> float:
        vals = [v for v in self.series(policy, metric) if not math.isnan(v)]
        return statistics.fmean(vals) if vals else math.nan

    def loss(self, policy: str, category: str) -> float:
        """Mean over runs of ``category``'s share of the policy's paid GPU-hours (sim/losses.py)."""
        vals = [r.losses[category] for r in self.runs if r.policy == policy and category in r.losses]
        return statistics.fmean(vals) if vals else math.nan

    def advice(self, policy: str) -> tuple[int, int, str | None]:
        """(jobs whose record describe would advise on, jobs run, the first advice), over every seed."""
        runs = [r for r in self.runs if r.policy == policy]
        first = next((r.advice for r in runs if r.advice), None)
        return sum(r.advised for r in runs), sum(r.jobs for r in runs), first

    def vs_spotrelay(self, policy: str) -> float:
        """Mean over seeds of ``policy``'s cost per useful GPU-hour over spotrelay's (a variant's figure)."""
        base = self.series("spotrelay", "cost_per_useful_gpu_hour")
        ratios = [v / b for v, b in zip(self.series(policy, "cost_per_useful_gpu_hour"), base, strict=False)
                  if math.isfinite(v) and math.isfinite(b) and b > 0]
        return statistics.fmean(ratios) if ratios and len(base) == self.seeds else math.nan

    def spread(self, policy: str, metric: str) -> float:
        vals = [v for v in self.series(policy, metric) if math.isfinite(v)]
        return statistics.stdev(vals) if len(vals) > 1 else 0.0

    def to_json(self) -> dict[str, Any]:
        def clean(v: float) -> float | None:
            return None if not math.isfinite(v) else round(v, 6)

        return {
            "nodes": self.nodes, "seeds": self.seeds, "trace": self.trace,
            "policies": {p: {k: clean(self.mean(p, k)) for k in METRICS} for p in self.policies()},
            "spread": {p: {k: clean(self.spread(p, k)) for k in METRICS} for p in self.policies()},
            "relative": {p: {"vs_on_demand": clean(self.mean(p, "vs_on_demand")),
                             "vs_price_limit": clean(self.mean(p, "vs_price_limit")),
                             "cross_region_moves": clean(self.mean(p, "cross_region_moves")),
                             "inconsistent_runs": int(sum(r.values.get("inconsistent", 0.0)
                                                          for r in self.runs if r.policy == p)),
                             "finished_share": clean(statistics.fmean(
                                 1.0 if r.finished else 0.0 for r in self.runs if r.policy == p)),
                             # jobs the deadline stopped before their steps were done (--deadline-hours)
                             "deadline_cut_share": clean(self.mean(p, "deadline_cut")),
                             # a variant's cost per useful GPU-hour over spotrelay's (mean of per-seed ratios)
                             **({"vs_spotrelay": clean(self.vs_spotrelay(p))} if p.startswith(VARIANT_PREFIX)
                                else {})}
                         for p in self.policies()},
            # shares of paid GPU-hours per phase (sim/losses.py; "useful" is goodput), mean over seeds
            "losses": {p: {c: clean(self.loss(p, c)) for c in CATEGORIES} for p in self.policies()},
            "events": self.events,
            "assumptions": self.assumptions,
            # describe's advice over the simulated job records (domain/advice.py), where a run got one
            "advice": {p: dict(zip(("jobs", "of", "advice"), said, strict=True))
                       for p in self.policies() if (said := self.advice(p))[0]},
        }


def _check_variants(opts: SimOptions) -> None:
    """With variants, every spotrelay policy's run built once on seed 0's market before any runs: a switch
    its spec or timings refuse stops the sweep at once, naming its variant, not after the runs before it
    (without variants the first run is spotrelay's: it stops the sweep as soon)."""
    if opts.variants:
        market = build_market(opts.market, 0)
        mine = [p for p in opts.policies if p == "spotrelay" or p in opts.variants]
        for policy in mine:
            make_run(policy, opts, market, 0, 0.0).dispose()


def run_count(opts: SimOptions) -> int:
    """How many runs a sweep of ``opts`` makes (one per seed, policy and job)."""
    return opts.seeds * opts.jobs * len(opts.policies)


def simulate(opts: SimOptions, progress: Progress | None = None) -> Report:
    """Every run of ``opts``; ``progress(n)``: n more runs are done (of ``run_count(opts)``), for a
    sweep's progress line. The report does not depend on it, nor on the worker count."""
    count = run_count(opts)
    if count > MAX_RUNS:
        kinds = f"{len(opts.policies)} {'policy' if len(opts.policies) == 1 else 'policies'}"
        raise ValueError(f"--seeds {opts.seeds} x --jobs {opts.jobs} x {kinds} is {count:,} runs; "
                         f"at most {MAX_RUNS:,} in one call (split the sweep)")
    started = time.perf_counter()
    _check_variants(opts)
    runs: list[RunResult] = []
    if opts.workers > 1 and count > 1:
        from spotrelay.sim.parallel import run_parallel

        runs = run_parallel(opts, opts.workers, progress)
    else:
        for seed in range(opts.seeds):
            runs.extend(run_seed(opts, seed, progress))
    return Report(nodes=opts.job.nodes, seeds=opts.seeds, trace=trace_label(opts.market), runs=runs,
                  seconds=time.perf_counter() - started, assumptions=assumptions(opts))
