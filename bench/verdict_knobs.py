"""The spot verdict's constants (placement/spot_evidence.py) swept side by side on the same markets and seeds:
how docs/simulator-tuning.md, "Spot verdict: a margin before lost", was measured.

    .venv/bin/python bench/verdict_knobs.py --variants "default;LOST_SHARE=1.0,HOLD_HOURS=12" \\
        [--markets g4dn,g4dn-nodes] [--nodes 8,16] [--seeds 10] [--job-hours 72] [--trace-dir bench-traces] \\
        [--switch min_nodes=8] [--workers 2]

A variant is ``default`` or comma-separated ``NAME=VALUE`` overrides of the module's constants that are read
when the verdict is asked (``VERDICT_KNOBS``) or of the catalog's restore minutes per family
(``P5_RESTORE_MINUTES``, ``P4D_RESTORE_MINUTES``: placement's loss per interruption); each run is a forked
process that sets them first, so the shipped code is what runs. ``--trace-dir``: every ``*.csv`` there
(bench/trace_variants.py writes some) is added as market ``STEM`` (capacity reading) and ``STEM-nodes`` (the
job's nodes are trace nodes). Markets also: those of bench/sim_sweep.py. Per (market, nodes) it prints each
variant's spotrelay cost per useful GPU-hour over the first variant's (mean, min-max over seeds), captured
saving, goodput, on-demand share, wall hours, seeds where on-demand was cheaper than spotrelay ("od miss")
and unfinished runs.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
from pathlib import Path
from typing import Any

from bench.sim_sweep import MARKETS
from spotrelay.placement import catalog, spot_evidence
from spotrelay.sim.build import MarketOptions
from spotrelay.sim.job import JobModel
from spotrelay.sim.report import cheaper
from spotrelay.sim.runner import SimOptions, parse_switch, run_seed

# constants the verdict reads at call time (a default argument bound at import would not follow a patch)
VERDICT_KNOBS = ("LOST_SHARE", "PAID_SHARE", "HOLD_HOURS", "HOLD_DOUBLINGS", "MIN_SPOT_ATTEMPTS",
                 "MIN_SPOT_SPAN_HOURS")
# the catalog's restore minutes (placement's loss per interruption), per family: the types each sets
CATALOG_KNOBS = {"P5_RESTORE_MINUTES": ("p5.48xlarge", "p5e.48xlarge"),
                 "P4D_RESTORE_MINUTES": ("p4d.24xlarge", "p4de.24xlarge")}
KNOBS = (*VERDICT_KNOBS, *CATALOG_KNOBS)


def parse_variant(text: str) -> dict[str, float]:
    """``default`` -> {}; ``A=1,B=2`` -> {A: 1.0, B: 2.0}; a name outside KNOBS or a bad value raises."""
    if text.strip() == "default":
        return {}
    out: dict[str, float] = {}
    for part in text.split(","):
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or name not in KNOBS:
            raise ValueError(f"variant {text!r}: {name!r} is not one of {', '.join(KNOBS)}")
        try:
            out[name] = float(value)
        except ValueError:
            raise ValueError(f"variant {text!r}: {name}={value!r} is not a number") from None
    return out


def _one(task: tuple[dict[str, float], dict[str, Any], int, int, float, dict[str, Any]]) -> dict[str, Any]:
    knobs, market, nodes, seed, hours, switches = task
    verdict = {name: value for name, value in knobs.items() if name in VERDICT_KNOBS}
    shipped = {name: getattr(spot_evidence, name) for name in verdict}
    catalog_shipped = dict(catalog.INSTANCES)
    try:
        for name, value in verdict.items():
            setattr(spot_evidence, name, type(shipped[name])(value))
        for name, types in CATALOG_KNOBS.items():
            if name in knobs:
                for itype in types:
                    catalog.INSTANCES[itype] = catalog.INSTANCES[itype].model_copy(
                        update={"restore_minutes": knobs[name]})
        opts = SimOptions(market=MarketOptions(**market), job=JobModel(nodes=nodes, job_hours=hours),
                          policies=("spotrelay", "on-demand", "price-limit"), spotrelay_switches=switches)
        return {r.policy: {**r.values, "finished": r.finished} for r in run_seed(opts, seed)}
    finally:  # (a forked worker dies after its run; in-process callers get the shipped values back)
        for name, value in shipped.items():
            setattr(spot_evidence, name, value)
        catalog.INSTANCES.update(catalog_shipped)


def _row(name: str, runs: list[dict[str, Any]], base: list[dict[str, Any]], width: int) -> str:
    sr = [r["spotrelay"] for r in runs]
    ratio = [s["cost_per_useful_gpu_hour"] / b["spotrelay"]["cost_per_useful_gpu_hour"]
             for s, b in zip(sr, base, strict=True)]
    captured = [s["captured_saving"] for s in sr]
    misses = sum(cheaper(r["on-demand"]["cost_per_useful_gpu_hour"], r["spotrelay"]["cost_per_useful_gpu_hour"])
                 for r in runs)
    return (f"  {name:{width}} {statistics.fmean(ratio):>7.3f} ({min(ratio):.2f}-{max(ratio):.2f}) "
            f"{statistics.fmean(captured):>8.3f} {statistics.fmean(s['goodput'] for s in sr):>7.3f} "
            f"{statistics.fmean(s['on_demand_share'] for s in sr):>6.0%} "
            f"{statistics.fmean(s['wall_hours'] for s in sr):>6.0f} "
            f"{misses:>7} {sum(not s['finished'] for s in sr):>5}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default="default", help="';'-separated: default or NAME=VALUE,...")
    parser.add_argument("--markets", default="g4dn,g4dn-nodes")
    parser.add_argument("--nodes", default="8,16")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--job-hours", type=float, default=72.0)
    parser.add_argument("--trace-dir", type=Path)
    parser.add_argument("--switch", action="append", default=[], help="NAME=VALUE, as simulate --switch")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    markets = dict(MARKETS)
    if args.trace_dir is not None:
        if not args.trace_dir.is_dir():
            print(f"error: --trace-dir {args.trace_dir}: no such folder", file=sys.stderr)
            return 2
        for trace in sorted(args.trace_dir.glob("*.csv")):
            markets[trace.stem] = {"traces": [str(trace)]}
            markets[f"{trace.stem}-nodes"] = {"traces": [str(trace)], "trace_semantics": "nodes"}
    try:
        names = [v.strip() for v in args.variants.split(";") if v.strip()]
        variants = [parse_variant(v) for v in names]
        switches = dict(parse_switch(s) for s in args.switch)
        sizes = [int(n) for n in args.nodes.split(",")]
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    unknown = [m for m in args.markets.split(",") if m not in markets]
    if unknown or not variants or args.seeds < 1 or args.workers < 1:
        print(f"error: unknown market {unknown[0]!r}" if unknown else "error: need a variant, seeds >= 1, workers >= 1",
              file=sys.stderr)
        return 2
    cells = [(m, n) for m in args.markets.split(",") for n in sizes]
    tasks = [(knobs, markets[m], n, seed, args.job_hours, switches)
             for m, n in cells for knobs in variants for seed in range(args.seeds)]
    # a fresh fork per run: the constants one run sets never reach another
    try:
        with multiprocessing.get_context("fork").Pool(args.workers, maxtasksperchild=1) as pool:
            results = pool.map(_one, tasks, chunksize=1)
    except ValueError as exc:  # a trace or CSV that does not read (SimInputError names the file and line)
        print(f"error: {exc}", file=sys.stderr)
        return 2
    width = max(32, *(len(n) for n in names))
    print(f"{'':2} {'variant':{width}} {'cost/first':>19} {'captured':>8} {'goodput':>7} {'on-dem':>6} {'wall h':>6} "
          f"{'od miss':>7} {'unfin':>5}")
    k = 0
    for market, nodes in cells:
        print(f"{market} {nodes} nodes, {args.seeds} seed(s)")
        per_variant = []
        for _ in variants:
            per_variant.append(results[k:k + args.seeds])
            k += args.seeds
        for name, runs in zip(names, per_variant, strict=True):
            print(_row(name, runs, per_variant[0], width), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
