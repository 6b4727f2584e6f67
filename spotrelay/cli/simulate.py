"""``spotrelay simulate``: the fleet simulator (spotrelay/sim, docs/simulator.md)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from spotrelay.cli.common import given_path, number_option, output_path
from spotrelay.cli.errors import UsageProblem, check_writable
from spotrelay.placement import catalog
from spotrelay.sim.bounds import (
    MAX_BOOT_S,
    MAX_CHECKPOINT_GB,
    MAX_CHECKPOINT_MINUTES,
    MAX_JOB_HOURS,
    MAX_RUNS,
    MAX_STEP_S,
    MAX_USD_PER_HOUR,
    MAX_WORKERS,
)

out = Console()
err = Console(stderr=True)
REDIRECTED_WIDTH = 240  # piped or redirected: where the lines under the table wrap (the table is one, uncut)


def _split(values: list[str] | None) -> list[str]:
    return [v.strip() for item in values or [] for v in item.split(",") if v.strip()]


def _given(**values: float | None) -> dict[str, Any]:
    """The options the user set (the others keep the model's own default: one copy of each)."""
    return {k: v for k, v in values.items() if v is not None}


def _plot_format(plot: Path) -> None:
    """A usage problem unless matplotlib writes ``--plot``'s suffix (checked before the runs). A name
    without one (``x``, ``x.``, ``.png``) is refused too: matplotlib would write ``x.png`` beside it."""
    from matplotlib.figure import Figure

    kinds = Figure().canvas.get_supported_filetypes()
    if not plot.suffix:
        raise UsageProblem(f"--plot {plot}: names no format; end it in .png or another matplotlib writes "
                           f"({', '.join(sorted(kinds))})")
    if plot.suffix[1:].lower() not in kinds:
        raise UsageProblem(f"--plot {plot}: format {plot.suffix!r} is not one matplotlib writes "
                           f"({', '.join(sorted(kinds))})")


@contextmanager
def _progress(total: int) -> Iterator[Callable[[int], None] | None]:
    """A progress line on stderr while a sweep of ``total`` runs runs, when stderr is a terminal (a pipe,
    a file or CI gets none); it disappears when the sweep ends."""
    if total < 2 or not err.is_terminal:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn, TimeRemainingColumn

    with Progress("simulating", BarColumn(), MofNCompleteColumn(), "runs,", TimeElapsedColumn(), "elapsed,",
                  TimeRemainingColumn(), "left", console=err, transient=True) as bar:
        task = bar.add_task("runs", total=total)
        yield lambda done: bar.advance(task, done)


def _strategy(text: str) -> str:
    """``--strategy``'s parser: a recovery strategy the spec takes (an empty one was silently the spec's
    default; another, a line naming a switch instead of the option)."""
    from typing import get_args

    from spotrelay.spec.models import Recovery

    known = get_args(Recovery.model_fields["strategy"].annotation)
    if text not in known:
        raise ValueError(f"{text!r} is not a recovery strategy ({' or '.join(known)})")
    return text


def _empty(trace: list[str] | None, **lists: tuple[list[str] | str | None, list[str]]) -> None:
    """A usage problem naming the first option given with nothing in it (an empty shell variable), which
    would run nothing, or every default. ``lists``: a comma list's option -> (what was typed, the names in
    it); each ``--trace`` names one file (an empty one was read as ".", the current folder)."""
    if any(not t.strip() for t in trace or []):
        raise UsageProblem("--trace names nothing (give FILE or POOL=FILE, or leave the option out)")
    for name, (typed, names) in lists.items():
        if typed is not None and not names:
            raise UsageProblem(f"--{name.replace('_', '-')} names nothing (give NAME,... or leave the option out)")


def _user_spec(path: Path | None, **flags: Any) -> Any:
    """``--spec``'s JobSpec (None without one). It states what the flags it replaces would: giving both
    is a usage problem, not a silent choice. A bad spec is reported field by field (cli/errors.py)."""
    if path is None:
        return None
    both = [f"--{name.replace('_', '-')}" for name, value in flags.items() if value is not None]
    if both:
        raise UsageProblem(f"--spec states the job: leave out {', '.join(both)} (or change the spec)")
    from spotrelay.spec.load import load_spec, suffix_problem

    problem = suffix_problem(path.name)
    if problem is not None:
        raise UsageProblem(f"--spec {path}: {problem}")
    return load_spec(path)


def _baseline_minutes(spec: Any, flag: float | None) -> float:
    """The job's fixed cadence, which the baselines keep: the flag's, the spec's minutes, else 30 (placement's
    assumed default; a spec with ``auto`` or only steps gives the baselines none of its own)."""
    if spec is None:
        return flag or 30.0
    return spec.checkpoint.fixed_minutes or 30.0


def _checkpoint_region(region: str | None) -> str | None:
    """``--checkpoint-region``: a region the catalog knows (any: the home region need not train)."""
    from spotrelay.sim.inputs import SimInputError

    known = sorted({r for r, _ in catalog.AZS})
    if region is not None and region not in known:
        raise SimInputError(f"--checkpoint-region: unknown region {region!r} (the catalog has {', '.join(known)})")
    return region


def _job_model(model: Any, nodes: int, checkpoint_gb: float | None, step_s: float | None, **fields: Any) -> Any:
    """The simulated job (``model``: sim.job.JobModel, imported late): the stated one, or your model's
    checkpoint size and your gang's step time on p5.48xlarge (the model keeps it for its reference gang)."""
    from spotrelay.sim.job import REF_NODES

    if checkpoint_gb is not None:
        fields["checkpoint_bytes"] = checkpoint_gb * 1e9
    if step_s is not None:
        fields["ref_step_s"] = step_s * nodes / REF_NODES  # (step time scales with 1 / nodes: one global batch)
    return model(nodes=nodes, **fields)


def simulate(
    trace: Annotated[list[str] | None, typer.Option(
        "--trace", help="FILE, or POOL=FILE (POOL: a glob over pool keys)")] = None,
    trace_format: Annotated[str, typer.Option("--trace-format", help="bamboo | pools-csv | synthetic")] = "bamboo",
    spec_file: Annotated[Path | None, typer.Option(
        "--spec", parser=given_path, help="your job spec: spotrelay runs its gang sizes, regions, instance types, "
        "markets, checkpoint and recovery settings (the stated job's model and step times stay; the baselines "
        "take its sizes and places)")] = None,
    nodes: Annotated[int | None, typer.Option("--nodes", min=1, max=512, help="gang size (default 16)")] = None,
    instance_types: Annotated[list[str] | None, typer.Option(
        "--instance-types", help="comma list (default p5.48xlarge,p4d.24xlarge)")] = None,
    regions: Annotated[list[str] | None, typer.Option(
        "--regions", help="comma list (default the catalog's four regions)")] = None,
    policies: Annotated[str, typer.Option("--policies", help="all or NAME,...")] = "all",
    seeds: Annotated[int, typer.Option("--seeds", min=1, max=MAX_RUNS, help="market seeds, the figures their mean and "
                                       "spread (seeds x jobs x policies: at most 100,000 runs a call)")] = 1,
    jobs: Annotated[int, typer.Option("--jobs", min=1, max=MAX_RUNS, help="independent jobs per seed")] = 1,
    job_hours: Annotated[float, typer.Option(
        "--job-hours", **number_option(0.01, MAX_JOB_HOURS), help="training hours at full speed")] = 168.0,
    checkpoint_minutes: Annotated[float | None, typer.Option(
        "--checkpoint-minutes", **number_option(0.1, MAX_CHECKPOINT_MINUTES),
        help="the job's cadence (default 30)")] = None,
    deadline_hours: Annotated[float | None, typer.Option(
        "--deadline-hours", **number_option(0.01, MAX_JOB_HOURS),
        help="stop each job this many wall hours after its start, done or not (a time-boxed run)")] = None,
    strategy: Annotated[str | None, typer.Option(
        "--strategy", parser=_strategy,
        help="spotrelay's recovery strategy, replace-cluster or replace-lost-nodes (default: the spec's)")] = None,
    switch: Annotated[list[str] | None, typer.Option(
        "--switch", help="a spotrelay variant, NAME=VALUE: spares=1, min_nodes=12, launch_at_notice=false, "
        "prewarm_on_rebalance=true, rebalance_checkpoint=false, keep_margin=0.2, every_minutes=auto")] = None,
    variant: Annotated[list[str] | None, typer.Option(
        "--variant", help="spotrelay with other switches, beside it on the same markets and seeds: "
        "NAME:SWITCH=VALUE[,SWITCH=VALUE...] (repeatable; e.g. elastic:min_nodes=8), its row spotrelay:NAME")] = None,
    boot_s: Annotated[float, typer.Option(
        "--boot-s", **number_option(0, MAX_BOOT_S), help="every type's boot (s)")] = 300.0,
    boot_s_for: Annotated[list[str] | None, typer.Option(
        "--boot-s-for", help="TYPE=S: one instance type's boot instead (p5.48xlarge=420)")] = None,
    # the model: your job's instead of the stated 70B one (unset: the stated job's)
    checkpoint_gb: Annotated[float | None, typer.Option(
        "--checkpoint-gb", **number_option(0.001, MAX_CHECKPOINT_GB), help="the whole checkpoint, every rank's shards "
        "(default 1120: 70B parameters x 16 bytes)")] = None,
    step_s: Annotated[float | None, typer.Option(
        "--step-s", **number_option(0.001, MAX_STEP_S),
        help="seconds per training step of the whole gang on p5.48xlarge "
        "(default: 17 s at 16 nodes, scaled by 16 / nodes)")] = None,
    # the physics a result depends on, for its sensitivity (unset: the stated job's and market's defaults)
    s3_gbps: Annotated[float | None, typer.Option(
        "--s3-gbps", **number_option(0.01, 1000), help="GB/s per node to or from S3 (restores, persists, the notice's "
        "flush; default 5)")] = None,
    transfer_usd_per_gb: Annotated[float | None, typer.Option(
        "--transfer-usd-per-gb", **number_option(0, 10), help="USD per GB of checkpoint sent between the "
        "checkpoints' region and a gang elsewhere, each save and restore (default 0: not charged; AWS charges "
        "0.02 between US regions)")] = None,
    checkpoint_region: Annotated[str | None, typer.Option(
        "--checkpoint-region", help="where the checkpoints live (default: the first of the regions, the home "
        "region's jobs bucket)")] = None,
    unannounced_share: Annotated[float | None, typer.Option(
        "--unannounced-share", **number_option(0, 1),
        help="share of reclaims without the notice (default 0.1)")] = None,
    rebalance_share: Annotated[float | None, typer.Option(
        "--rebalance-share", **number_option(0, 1), help="share of reclaims a rebalance recommendation precedes "
        "(default 0.5)")] = None,
    on_demand_price: Annotated[float | None, typer.Option(
        "--on-demand-price", **number_option(0, MAX_USD_PER_HOUR),
        help="USD per node-hour for every on-demand pool instead of the catalog's (Bamboo's: 3.06)")] = None,
    spot_price: Annotated[float | None, typer.Option(
        "--spot-price", **number_option(0, MAX_USD_PER_HOUR),
        help="USD per node-hour for every spot pool instead of the catalog's (Bamboo's: 0.91); at most each "
        "pool's on-demand price")] = None,
    json_path: Annotated[Path | None, typer.Option(
        "--json", parser=output_path, help="write every policy's figures as JSON")] = None,
    plot: Annotated[Path | None, typer.Option(
        "--plot", parser=output_path, help="write a PNG, F.png (or another format matplotlib writes, by its "
        "suffix): cost against goodput, one run's timeline")] = None,
    workers: Annotated[int | None, typer.Option(
        "--workers", min=1, max=MAX_WORKERS, help="processes for the runs (default: the CPU count for a sweep, 1 "
        "for a small run; 1: in this process); the results do not depend on it")] = None,
) -> None:
    """Replay spotrelay's decisions and the baselines over a spot market; compare cost and goodput."""
    from spotrelay.sim.build import MarketOptions, parse_boot_for
    from spotrelay.sim.inputs import SimInputError
    from spotrelay.sim.job import JobModel
    from spotrelay.sim.parallel import default_workers
    from spotrelay.sim.report import print_report, write_json, write_plot
    from spotrelay.sim.runner import POLICIES, SimOptions, parse_switch, run_count
    from spotrelay.sim.runner import simulate as run_simulation
    from spotrelay.sim.variants import parse_variants, with_variants

    if json_path is not None:
        check_writable(json_path, "--json")
    if plot is not None:
        check_writable(plot, "--plot")
        _plot_format(plot)
    chosen = POLICIES if policies == "all" else tuple(dict.fromkeys(_split([policies])))  # (a name twice: once)
    named_regions, named_types = _split(regions), _split(instance_types)
    spec = _user_spec(spec_file, nodes=nodes, regions=regions, instance_types=instance_types,
                      checkpoint_minutes=checkpoint_minutes, strategy=strategy)
    _empty(trace, policies=(policies, list(chosen)), regions=(regions, named_regions),
           instance_types=(instance_types, named_types))
    bad = [p for p in chosen if p not in POLICIES]
    if bad or trace_format not in ("bamboo", "pools-csv", "synthetic"):
        what = f"policy {bad[0]!r} (known: {', '.join(POLICIES)})" if bad else f"--trace-format {trace_format!r}"
        err.print(f"[red]error:[/] unknown {what}", soft_wrap=True, highlight=False)
        raise typer.Exit(2)
    try:
        variants = parse_variants(variant or [])
        opts = SimOptions(
            market=MarketOptions(traces=list(trace or []), trace_format=trace_format,  # type: ignore[arg-type]
                                 regions=spec.resources.regions if spec else named_regions or list(
                                     catalog.DEFAULT_REGIONS),
                                 instance_types=spec.resources.instance_types if spec else named_types or [
                                     "p5.48xlarge", "p4d.24xlarge"],
                                 boot_s=boot_s, boot_s_by_type=parse_boot_for(boot_s_for),
                                 on_demand_price=on_demand_price, spot_price=spot_price,
                                 **_given(unannounced_share=unannounced_share, rebalance_share=rebalance_share)),
            job=_job_model(JobModel, spec.resources.nodes if spec else nodes or 16, checkpoint_gb, step_s,
                           job_hours=job_hours, checkpoint_minutes=_baseline_minutes(spec, checkpoint_minutes),
                           strategy=strategy, deadline_hours=deadline_hours,
                           checkpoint_region=_checkpoint_region(checkpoint_region),
                           **_given(s3_gbps=s3_gbps, transfer_usd_per_gb=transfer_usd_per_gb)),
            policies=with_variants(chosen, variants), variants=variants, seeds=seeds, jobs=jobs,
            timeline=plot is not None,
            spotrelay_switches={**({"spec": spec} if spec else {}), **dict(parse_switch(s) for s in switch or [])},
            workers=workers or 1,
        )
        if workers is None:
            opts.workers = default_workers(opts)
        with _progress(run_count(opts)) as told:
            report = run_simulation(opts, told)
    except (SimInputError, ValueError) as exc:
        message = " ".join(str(exc).split())  # one line, all of it (a name with a newline was cut there)
        if spec_file is not None:  # the spec gave the regions and types: name its fields, not the flags
            for flag, field_name in (("--regions:", "resources.regions:"), ("--instance-types:",
                                                                            "resources.instance_types:")):
                if message.startswith(flag):
                    message = f"--spec {spec_file}: {field_name}{message[len(flag):]}"
        err.print(f"[red]error:[/] {escape(message)}", soft_wrap=True, highlight=False)  # ([bold]x.csv as written)
        raise typer.Exit(2) from None
    # a terminal gets as many tables as its width needs; a pipe or file one table, a row per policy (cli/tables.py)
    print_report(report, out if out.is_terminal else Console(width=REDIRECTED_WIDTH))
    for option, path, write in (("--json", json_path, write_json), ("--plot", plot, write_plot)):
        if path is None:
            continue
        try:  # (checked before the run; a disk that fills meanwhile is named, the table above stays)
            write(report, path)
        except OSError as exc:
            raise UsageProblem(f"{option} {path}: cannot be written ({exc.strerror or exc}); the results "
                               "are in the table above") from exc
        out.print(f"wrote {path}")
