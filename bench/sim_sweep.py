"""One switch at a time on spotrelay's shipped defaults, beside on-demand and the price limit, on the
same markets and seeds: the evidence for a default (docs/simulator.md, "Tuning sweeps").

    .venv/bin/python bench/sim_sweep.py [--nodes 8,16] [--seeds 3] [--job-hours 72]
        [--markets g4dn,g4dn-nodes,synthetic] [--variants NAME,...] [--plot docs/img/simulator-sweep.png]

Markets: ``g4dn`` (the shipped trace, capacity semantics, catalog prices, 300 s boot), ``g4dn-nodes``
(the same trace read pessimistically: the job's nodes are trace nodes), ``bamboo`` (the trace under
Bamboo's published prices and 45 s boot), ``synthetic`` (Spot Advisor bands and a seed). For every
(market, nodes) it prints each variant's captured saving (mean and worst seed), goodput, on-demand
share, recoveries, its cost per useful GPU-hour over the default's (mean of per-seed ratios) and over
on-demand's, its wall hours, and how many of its runs did not finish (a failed job's means are not a
result; ``spot wait N``: ``recovery.spot_wait_minutes``, waiting costs wall time;
``elastic n/2 wX``: ``resources.min_nodes`` = half the gang with ``resources.wall_time_weight`` X;
``max slowdown L``: ``recovery.max_slowdown``, wall time bounded at about L times on-demand's).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path
from typing import Any

from spotrelay.sim.build import MarketOptions
from spotrelay.sim.job import JobModel
from spotrelay.sim.runner import Report, SimOptions, simulate

TRACE = str(Path(__file__).resolve().parents[1] / "spotrelay" / "local" / "data" / "bamboo-g4dn-trace.csv")
# Bamboo's 64-node p3 recording (docs/simulator-tuning.md, "Reclaim waves"): pools of 37-75, drops of up to 11 at once
P3_TRACE = str(Path(__file__).resolve().parents[1] / "spotrelay" / "local" / "data" / "bamboo-p3-64-trace.csv")
MARKETS: dict[str, dict[str, Any]] = {
    "g4dn": {"traces": [TRACE]},
    "g4dn-nodes": {"traces": [TRACE], "trace_semantics": "nodes"},
    "bamboo": {"traces": [TRACE], "boot_s": 45.0, "on_demand_price": 3.06, "spot_price": 0.91},
    "synthetic": {"trace_format": "synthetic"},
    "p3": {"traces": [P3_TRACE]},
}
# name -> (spotrelay switches, market options)
VARIANTS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "default": ({}, {}),
    "replace-cluster": ({"strategy": "replace-cluster"}, {}),
    "no launch at notice": ({"launch_at_notice": False}, {}),
    "no rebalance ckpt": ({"rebalance_checkpoint": False}, {}),
    "prewarm": ({"prewarm_on_rebalance": True}, {}),
    "spares 1": ({"spares": 1}, {}),
    "keep margin 0.5": ({"keep_margin": 0.5}, {}),
    "unsized scores": ({}, {"gang_scores": False}),
    "elastic n/2": ({"min_nodes": "half"}, {}),
    # resources.wall_time_weight: how much wall time counts against a smaller gang (placement's default
    # shrink_delay_weight when unstated)
    "elastic n/2 w0": ({"min_nodes": "half", "wall_time_weight": 0.0}, {}),
    "elastic n/2 w0.1": ({"min_nodes": "half", "wall_time_weight": 0.1}, {}),
    "elastic n/2 w0.25": ({"min_nodes": "half", "wall_time_weight": 0.25}, {}),
    "elastic n/2 w0.5": ({"min_nodes": "half", "wall_time_weight": 0.5}, {}),
    "spot wait 15": ({"spot_wait_minutes": 15}, {}),
    "spot wait 30": ({"spot_wait_minutes": 30}, {}),
    "spot wait 60": ({"spot_wait_minutes": 60}, {}),
    # recovery.max_slowdown: a schedule of on-demand's wall time x L (docs/placement.md, "A schedule")
    "max slowdown 2": ({"max_slowdown": 2.0}, {}),
    "max slowdown 1.5": ({"max_slowdown": 1.5}, {}),
}


def run(market: str, nodes: int, seeds: int, hours: float, switches: dict[str, Any],
        extra: dict[str, Any]) -> Report:
    sw = {k: (nodes // 2 if v == "half" else v) for k, v in switches.items()}
    return simulate(SimOptions(market=MarketOptions(**MARKETS[market], **extra), seeds=seeds,
                               job=JobModel(nodes=nodes, job_hours=hours),
                               policies=("spotrelay", "on-demand", "price-limit"), spotrelay_switches=sw))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="8,16")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--job-hours", type=float, default=72.0)
    parser.add_argument("--markets", default="g4dn,synthetic")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--plot", type=Path)
    args = parser.parse_args()
    names = [v for v in args.variants.split(",") if v]
    unknown = [v for v in names if v not in VARIANTS] + [m for m in args.markets.split(",") if m not in MARKETS]
    if unknown:
        print(f"error: unknown variant or market {unknown[0]!r}", file=sys.stderr)
        return 2
    rows: list[tuple[str, int, str, float]] = []
    print(f"{'market':10} {'nodes':>5} {'variant':20} {'captured':>8} {'worst':>6} {'goodput':>7} {'on-dem':>6} "
          f"{'recov':>6} {'cost/default':>12} {'vs od':>6} {'wall h':>6} {'unfin':>5}")
    for market in args.markets.split(","):
        for nodes in [int(n) for n in args.nodes.split(",")]:
            base: list[float] = []
            for name in names:
                report = run(market, nodes, args.seeds, args.job_hours, *VARIANTS[name])
                cost = report.series("spotrelay", "cost_per_useful_gpu_hour")
                base = base or cost
                ratio = statistics.fmean(c / b for c, b in zip(cost, base, strict=True)
                                         if math.isfinite(c) and math.isfinite(b) and b > 0)
                captured = report.series("spotrelay", "captured_saving")
                # a run cut off unfinished (a failed job: the stall budget, max_placing_minutes) has
                # cheap-looking numbers over the little it trained: count them beside the means
                unfinished = sum(not r.finished for r in report.runs if r.policy == "spotrelay")
                rows.append((market, nodes, name, report.mean("spotrelay", "captured_saving")))
                print(f"{market:10} {nodes:>5} {name:20} {report.mean('spotrelay', 'captured_saving'):>8.3f} "
                      f"{min(captured):>6.2f} {report.mean('spotrelay', 'goodput'):>7.3f} "
                      f"{report.mean('spotrelay', 'on_demand_share'):>6.0%} "
                      f"{report.mean('spotrelay', 'recoveries'):>6.0f} {ratio:>12.3f} "
                      f"{report.mean('spotrelay', 'vs_on_demand'):>6.3f} "
                      f"{report.mean('spotrelay', 'wall_hours'):>6.1f} {unfinished:>5}",
                      flush=True)
    if args.plot:
        plot(rows, names, args)
    return 0


def plot(rows: list[tuple[str, int, str, float]], names: list[str], args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(dict.fromkeys((m, n) for m, n, _, _ in rows))
    fig, ax = plt.subplots(figsize=(min(16.0, max(8.0, 1.2 * len(groups) * len(names) / 3)), 4.5))
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        values = [next(v for m, n, v_name, v in rows if (m, n) == g and v_name == name) for g in groups]
        ax.bar([g + i * width for g in range(len(groups))], values, width, label=name)
    ax.set_xticks([g + 0.4 - width / 2 for g in range(len(groups))], [f"{m}\n{n} nodes" for m, n in groups])
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_ylabel("captured saving (1 = the price limit)")
    ax.set_title(f"spotrelay variants, {args.seeds} seeds, {args.job_hours:g} h jobs")
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(args.plot, dpi=110)
    print(f"wrote {args.plot}")


if __name__ == "__main__":
    sys.exit(main())
