"""Show a simulation: a Rich table per policy, the JSON document, a PNG (cost vs goodput; a timeline)."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from spotrelay.cli.tables import Justify, fitted, show
from spotrelay.sim.assumptions import summary
from spotrelay.sim.baselines import BASELINES
from spotrelay.sim.losses import CATEGORIES
from spotrelay.sim.runner import VARIANT_PREFIX, Report, RunResult
from spotrelay.sim.timeline import BOOT, TRAIN, bars
from spotrelay.sim_native import in_use

COLUMNS = (
    ("$/useful GPU-h", "cost_per_useful_gpu_hour", "{:.3f}"), ("vs on-demand", "vs_on_demand", "{:.3f}"),
    ("vs price-limit", "vs_price_limit", "{:.3f}"), ("captured", "captured_saving", "{:.2f}"),
    ("goodput", "goodput", "{:.3f}"), ("cost $", "cost_usd", "{:,.0f}"), ("wall h", "wall_hours", "{:.1f}"),
    ("steps lost", "steps_lost", "{:.0f}"), ("interrupts", "interruptions", "{:.0f}"),
    ("recoveries", "recoveries", "{:.0f}"), ("rec p50 s", "recovery_s_p50", "{:.0f}"),
    ("rec p95 s", "recovery_s_p95", "{:.0f}"), ("on-demand", "on_demand_share", "{:.0%}"),
    ("x-region", "cross_region_moves", "{:.0f}"),
)


def _cell(report: Report, policy: str, metric: str, fmt: str) -> str:
    mean = report.mean(policy, metric)
    if not math.isfinite(mean):
        return "-"
    text = fmt.format(mean)
    spread = report.spread(policy, metric)
    return f"{text} ±{fmt.format(spread)}" if report.seeds > 1 and spread > 0 and "%" not in fmt else text


_JUSTIFY: list[Justify] = ["left"]
_JUSTIFY += ["right" for _ in COLUMNS]  # (the policy, then numbers)


def _rows(report: Report) -> tuple[list[str], list[list[str]]]:
    headers = ["policy", *(title for title, _, _ in COLUMNS)]
    rows = [[policy, *(_cell(report, policy, metric, fmt) for _, metric, fmt in COLUMNS)]
            for policy in report.policies()]
    return headers, rows


def _title(report: Report) -> str:
    return f"{report.nodes} nodes, trace {report.trace}, {report.seeds} seed(s)" + (
        " (mean ± stdev)" if report.seeds > 1 else "")


def tables(report: Report, width: int) -> list[Table]:
    """The report's columns as tables at most ``width`` wide, the policy column in each (cli/tables.py)."""
    headers, rows = _rows(report)
    return fitted(headers, rows, width, title=_title(report), justify=_JUSTIFY)


# a tie is not a cheaper rival: two policies that paid the same (both on on-demand all along, where no spot
# pool holds the gang) sum their bills in another order, and their costs differ in the last bits
TIE_RELATIVE = 1e-9


def cheaper(cost: float, than: float) -> bool:
    """``cost`` is below ``than`` by more than float rounding: target (c)'s miss, counted one way everywhere."""
    return cost < than * (1.0 - TIE_RELATIVE)


def cheapest_rival(costs: Mapping[str, float]) -> tuple[str, float] | None:
    """Of one seed's costs per useful GPU-hour (policy -> USD), the baseline but ``price-limit`` that cost
    least and its cost (target (c)'s rival; spotrelay's variants are not rivals); None without one."""
    rivals = [(v, p) for p, v in costs.items() if p in BASELINES and p != "price-limit" and math.isfinite(v)]
    if not rivals:
        return None
    cost, name = min(rivals)
    return name, cost


def cheaper_rivals(report: Report) -> tuple[int, int, dict[str, int], float]:
    """Target (c) per run: (seeds on which a baseline but ``price-limit`` cost less per useful GPU-hour
    than spotrelay, seeds where both ran, how often each such baseline was the cheapest, spotrelay's mean
    excess over the cheapest on those seeds)."""
    costs: dict[int, dict[str, float]] = {}
    beaten: dict[str, int] = {}
    excess: list[float] = []
    for r in report.runs:
        costs.setdefault(r.seed, {})[r.policy] = r.values.get("cost_per_useful_gpu_hour", math.nan)
    seeds = 0
    for by_policy in costs.values():
        ours, rival = by_policy.get("spotrelay", math.nan), cheapest_rival(by_policy)
        if rival is None or not math.isfinite(ours):
            continue
        seeds += 1
        name, cheapest = rival
        if cheaper(cheapest, ours):
            beaten[name] = beaten.get(name, 0) + 1
            excess.append(ours / cheapest - 1.0)
    return len(excess), seeds, beaten, statistics.fmean(excess) if excess else 0.0


def print_report(report: Report, console: Console) -> None:
    headers, rows = _rows(report)  # (a terminal gets as many tables as its width needs: cli/tables.py)
    show(console, headers, rows, title=_title(report), justify=_JUSTIFY)
    missed, seeds, beaten, excess = cheaper_rivals(report)
    if missed:  # (the simulator's target (c) is spotrelay cheapest but the bound on every seed: say when not)
        who = ", ".join(f"{p} on {n}" for p, n in sorted(beaten.items()))
        console.print(f"spotrelay was not the cheapest per useful GPU-hour on {missed} of {seeds} seed(s) ({who}; "
                      f"{excess:.1%} dearer on average there): docs/simulator.md, \"Where the targets stand\"",
                      highlight=False, soft_wrap=True)
    bad = sum(1 for r in report.runs if r.values.get("inconsistent"))
    if bad:
        console.print(f"[yellow]warning:[/] {bad} run(s) counted more useful than paid GPU-hours "
                      "(a known accounting gap in notice-window runs; see docs/simulator.md)")
    for policy in report.policies():  # a failed run's means cover only what it trained: cheap-looking
        runs = [r for r in report.runs if r.policy == policy]
        failed = [r for r in runs if not r.finished]
        if failed:
            reasons = sorted({r.failed or "did not finish" for r in failed})
            console.print(f"[yellow]warning:[/] {policy}: {len(failed)} of {len(runs)} run(s) did not finish "
                          f"({'; '.join(reasons[:3])}); its numbers cover only what they trained",
                          highlight=False, soft_wrap=True)
        cut = report.mean(policy, "deadline_cut")
        if cut > 0:
            console.print(f"{policy}: the deadline stopped {cut:.0%} of its jobs before their steps were done; "
                          "they count the steps they reached", highlight=False, soft_wrap=True)
    console.print("where paid GPU-hours went (share, mean over seeds; useful = goodput):")
    for policy in report.policies():
        parts = [(c, report.loss(policy, c)) for c in CATEGORIES]
        shares = ", ".join(f"{c} {v:.3f}" for c, v in parts if math.isfinite(v) and v >= 0.0005)
        console.print(f"  {policy}: {shares or 'nothing paid (no gang ever launched)'}")
    moved = [(p, report.mean(p, "transfer_usd"), report.mean(p, "cost_usd")) for p in report.policies()]
    moved = [(p, t, c) for p, t, c in moved if math.isfinite(t) and t > 0 and c > 0]
    if moved:  # (in cost $ already: the share a gang away from its checkpoints paid to move them)
        console.print("checkpoints sent between regions (in cost $; mean over seeds): " + ", ".join(
            f"{p} ${t:,.0f} ({t / c:.0%})" for p, t, c in moved), highlight=False, soft_wrap=True)
    for policy in report.policies():  # spotrelay's variants (--variant) against spotrelay
        versus = report.vs_spotrelay(policy) if policy.startswith(VARIANT_PREFIX) else math.nan
        if math.isfinite(versus):
            console.print(f"{policy}: {versus:.3f}x spotrelay's cost per useful GPU-hour (mean of per-seed ratios), "
                          f"goodput {report.mean(policy, 'goodput'):.3f} against "
                          f"{report.mean('spotrelay', 'goodput'):.3f}", highlight=False, soft_wrap=True)
    for policy in report.policies():
        advised, of, advice = report.advice(policy)
        if advice:
            console.print(f"{policy}: `spotrelay describe` would advise on {advised} of {of} job(s): {advice}",
                          highlight=False, soft_wrap=True)
    for line in summary(report.assumptions) if report.assumptions else []:
        console.print(line, highlight=False, soft_wrap=True)
    rate = report.events / report.seconds if report.seconds else 0.0
    console.print(f"{report.events:,} simulated events in {report.seconds:.2f} s ({rate:,.0f} events/s; "
                  f"simulator: {in_use()})", highlight=False)


def write_json(report: Report, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report.to_json(), indent=2) + "\n")


def _draw_timeline(ax: Any, timeline: list[tuple[float, str, str]], seed: int, policy: str) -> None:
    """One run as bars per pool: booting (grey), training (green); red ticks where the market took a node."""
    drawn = bars(timeline)
    pools = drawn.pools()
    colors = {BOOT: "silver", TRAIN: "tab:green"}
    for row, pool in enumerate(pools):
        spans = drawn.spans[pool]
        ax.broken_barh([(a / 3600.0, (b - a) / 3600.0) for a, b, _ in spans], (row - 0.35, 0.7),
                       facecolors=[colors[phase] for _, _, phase in spans], linewidth=0)
    ticks = [(t / 3600.0, pools.index(p)) for t, p in drawn.losses if p in pools]
    if ticks:
        ax.scatter([x for x, _ in ticks], [y for _, y in ticks], marker="|", c="red", s=25, linewidths=0.5, zorder=3)
    ax.set_yticks(range(len(pools)), [p.replace("/spot", " s").replace("/on-demand", " od") for p in pools],
                  fontsize=6)
    ax.set_ylim(-0.7, max(1, len(pools)) - 0.3)
    ax.invert_yaxis()  # the first pool used on top
    ax.set_xlabel("hours")
    ax.set_title(f"{policy}, seed {seed}: booting (grey), training (green), nodes lost (red)")


def timeline_run(report: Report) -> RunResult | None:
    """The run the plot draws: spotrelay's first, else a variant's, else the first policy's (``--policies``
    without spotrelay); None when no run kept its timeline."""
    kept = [r for r in report.runs if r.timeline]
    return min(kept, key=lambda r: (r.policy != "spotrelay", not r.policy.startswith(VARIANT_PREFIX)), default=None)


def write_plot(report: Report, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    for policy in report.policies():
        xs, ys = report.series(policy, "goodput"), report.series(policy, "cost_per_useful_gpu_hour")
        left.scatter(xs, ys, label=policy)
    left.set_xlabel("goodput (useful / paid GPU-hours)")
    left.set_ylabel("USD per useful GPU-hour")
    left.set_title(f"cost against goodput, {report.nodes} nodes, {report.seeds} seed(s)")
    left.legend()
    run = timeline_run(report)
    if run is not None:
        _draw_timeline(right, run.timeline, run.seed, run.policy)
    else:
        right.set_axis_off()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
