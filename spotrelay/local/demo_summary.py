"""Turn what the demo recorded into its summary: results from every node's disk, the reference
comparison, recovery times, cost, the PNG and the MLflow record."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from spotrelay.contracts.control import TrainerEvent, read_events
from spotrelay.local import demo_elastic
from spotrelay.local import demo_report as report
from spotrelay.local.chaos import Places, places_of
from spotrelay.local.downtime import FaultTimes
from spotrelay.local.fault_timing import agent_start, resumed_after, stop_after_notice
from spotrelay.local.market import MarketModel
from spotrelay.local.reference import read_progress, read_results

if TYPE_CHECKING:
    from spotrelay.local.demo import DemoOptions, Recorder
    from spotrelay.local.twin import Twin

RESULT = "result"  # the training script's --out, relative to each node's disk


def attempt_results(twin: Twin, places: Places | None = None) -> dict[int, dict[int, dict[str, Any]]]:
    """attempt -> rank -> the training script's result file on that node's disk. ``places``: the
    attempt each instance served last (a survivor's or a promoted spare's file is its last run's)."""
    assert twin.compute is not None
    out: dict[int, dict[int, dict[str, Any]]] = {}
    for li in twin.compute.instances():
        prefix = li.work_dir / RESULT
        results = read_results(prefix)
        for rank, steps in read_progress(prefix).items():
            results.setdefault(rank, {"losses": steps, "killed": True})  # no result file: died mid-run
        for rank, result in results.items():
            attempt = (places or {}).get(li.instance.instance_id, (li.instance.attempt or 0, rank))[0]
            out.setdefault(attempt, {})[rank] = result
    return out


def node_events(twin: Twin) -> list[TrainerEvent]:
    """Every trainer event every node wrote (each stamped with its attempt and world size)."""
    assert twin.compute is not None
    return [e for li in twin.compute.instances() for e in read_events(li.work_dir / "control")[0]]


def settle_fault(f: report.Fault, twin: Twin, events: list[TrainerEvent], any_size: bool = False) -> None:
    """Correct what the live view saw with the real records: the fault at the instance's notice or
    end, training back when the next attempt finished its first step at full size (``any_size``: at
    whatever size it resumed, the elastic scenario), from the step its trainers restored."""
    assert twin.compute is not None
    life = next((li for li in twin.compute.instances() if li.instance.instance_id == f.instance_id), None)
    if life is not None:
        at = life.notice_at if f.kind == "spot-notice" else life.ended_at
        f.time = at if at is not None else f.time
    stopped = f.time if f.kind == "node-lost" else (stop_after_notice(events, f.attempt)[0] or f.time)
    back = resumed_after(events, f.attempt, stopped, any_size)
    f.resumed_at = back.at if back else None
    f.resumed_from_step = back.from_step if back else None


def fault_times(f: report.Fault, twin: Twin, market: MarketModel, events: list[TrainerEvent],
                nodes: int | None = None) -> FaultTimes:
    """When training stopped, when the next attempt's newest node was launched, booted, ready and
    started training, and the notice's final commit and deadline (spotrelay/local/fault_timing.py)."""
    assert twin.compute is not None
    stopped, commit_at, reclaim_at = f.time, None, None
    if f.kind == "spot-notice":
        stop, commit_at, reclaim_at = stop_after_notice(events, f.attempt)
        stopped = stop if stop is not None else f.time
        reclaim_at = reclaim_at or f.time + market.notice_window()
    # the replacements the next attempt waited for: not the hot spares launched in the background
    new = [li for li in twin.compute.instances() if li.instance.attempt == f.attempt + 1
           and (nodes is None or li.instance.rank is None or li.instance.rank < nodes)]
    newest = max(new, key=lambda li: li.launched_at, default=None)
    booted = [li.booted_at for li in new]
    ready, started = agent_start(newest.work_dir) if newest is not None else (None, None)
    return FaultTimes(
        kind=f.kind,
        fault_at=f.time,
        stopped_at=stopped,
        resumed_at=f.resumed_at,
        launched_at=newest.launched_at if newest is not None else None,
        booted_at=max(b for b in booted if b is not None) if booted and None not in booted else None,
        window_s=market.notice_window() if f.kind == "spot-notice" else None,
        final_commit_at=commit_at,
        reclaim_at=reclaim_at,
        ready_at=ready,
        started_at=started,
    )


def _losses(results: dict[int, dict[str, Any]]) -> dict[int, float]:
    rank0 = results.get(0) or {}
    return {int(step): float(loss) for step, loss in rank0.get("losses", [])}


def summarize(
    opts: DemoOptions,
    twin: Twin,
    rec: Recorder,
    market: MarketModel,
    nodes: int,
    tracking_uri: str,
    experiment: str,
    t0: float,
) -> report.Summary:
    assert twin.compute is not None
    end = time.time()
    problems: list[str] = []
    job = rec.job
    status = job.status.value if job else "NOT-CREATED"
    if status != "SUCCEEDED":
        problems.append(f"job ended {status}" + (f": {'; '.join(job.reasons)}" if job and job.reasons else ""))
    elastic = opts.scenario == "elastic"
    per_attempt = attempt_results(twin, places_of(rec.nodes))
    losses = {a: _losses(r) for a, r in per_attempt.items()}
    if elastic:  # a survivor ran several attempts: its per-step file says which steps each one trained
        losses = demo_elastic.losses_by_attempt(twin, rec.nodes)
    ref = read_results((opts.out / "reference" / RESULT).resolve())
    ref_losses = _losses(ref)
    final = per_attempt.get(max(per_attempt), {}) if per_attempt else {}
    final_sha = [final[r].get("state_sha256") for r in sorted(final)]
    ref_sha = [ref[r]["state_sha256"] for r in sorted(ref)]
    finished = bool(final) and all(r.get("exit") == 0 for r in final.values())
    bit_identical = (final_sha == ref_sha and len(final_sha) == nodes) if (ref and finished) else None
    if opts.reference and not ref:
        problems.append("the reference run wrote no results (see reference/train.log)")
    if bit_identical is False and not elastic:  # another world size sums in another order: not bitwise
        problems.append("the final model differs from the uninterrupted reference")
    compared = [(s, v) for attempt in losses.values() for s, v in attempt.items() if s in ref_losses]
    losses_identical = all(ref_losses[s] == v for s, v in compared) if compared else None
    if losses_identical is False and not elastic:
        problems.append("some per-step losses differ from the reference")
    elastic_facts: dict[str, Any] = {}
    if elastic:
        sizes = demo_elastic.world_sizes(rec.nodes)
        small = _losses(read_results((opts.out / demo_elastic.SMALL_REFERENCE / RESULT).resolve()))
        last = len(losses.get(max(sizes), {})) if sizes else None
        elastic_facts, found = demo_elastic.judge(demo_elastic.every_loss(twin), ref_losses, sizes, nodes,
                                                  small or None, last)
        problems += found
    faults = rec.faults
    events = node_events(twin)
    for f in faults:
        settle_fault(f, twin, events, any_size=elastic)
    wanted = ("spot-notice",) if elastic else ("spot-notice", "node-lost")
    if not all(any(f.kind == kind for f in faults) for kind in wanted):
        problems.append("not every planned fault fired (the run may have been too fast or too slow)")
    for f in faults:
        if f.resumed_at is None:
            problems.append(f"no recovery seen after the {f.kind} on {f.node}")
    lifetimes = twin.compute.history()
    png = opts.out / "timeline.png"
    try:
        report.timeline_png(png, ref_losses, losses, faults, lifetimes, t0,
                            demo_elastic.world_sizes(rec.nodes) if elastic else None)
    except Exception as exc:  # the summary still matters without a picture
        problems.append(f"timeline not drawn: {exc}")
    steps_lost = job.steps_lost if job else 0
    if not steps_lost:  # the controller's count, else ours: steps run past the checkpoint resumed from
        steps_lost = sum(max(0, (f.step or 0) - (f.resumed_from_step or f.step or 0)) for f in faults)
    rows = report.recoveries(faults, market, [fault_times(f, twin, market, events, nodes) for f in faults])
    summary = report.Summary(
        ok=not problems,
        job_id=job.job_id if job else None,
        status=status,
        attempts=job.attempt if job else 0,
        interruptions=sum(f.kind == "spot-notice" for f in faults),
        node_losses=sum(f.kind == "node-lost" for f in faults),
        steps_lost=steps_lost,
        recoveries=rows,
        # elastic: another world size sums in another order, so bit identity is not a target there
        targets=report.targets(rows, steps_lost, None if elastic else bit_identical, opts.spares or 0),
        bit_identical=bit_identical,
        final_state_sha256=final_sha[0] if final_sha else None,
        reference_state_sha256=ref_sha[0] if ref_sha else None,
        losses_compared=len(compared),
        losses_identical=losses_identical,
        cost=report.costs(lifetimes, market, faults, end),
        wall_s=round(end - t0, 1),
        timeline_png=str(png) if png.exists() else None,
        mlflow_run_id=None,
        mlflow_tracking_uri=tracking_uri,
        problems=problems,
        elastic=elastic_facts,
    )
    if elastic_facts:
        worst = elastic_facts["loss_max_rel_diff"]
        summary.targets["loss_vs_reference_rel"] = {"target": f"<= {demo_elastic.LOSS_RTOL:.0e}", "value": worst,
                                                    "met": worst <= demo_elastic.LOSS_RTOL
                                                    if elastic_facts["losses_compared"] else None}
    summary.cost["controller_cost_so_far_usd"] = round(job.cost_so_far, 4) if job else 0.0
    try:
        summary.mlflow_run_id = report.log_to_mlflow(
            tracking_uri, job.mlflow_run_id if job else None, experiment, summary, [png]
        )
        summary.mlflow_lineage = report.mlflow_lineage(tracking_uri, summary.mlflow_run_id)
    except Exception as exc:
        summary.problems.append(f"MLflow logging failed: {exc}")
    return summary


def _parts(parts: dict[str, float] | None) -> str:
    if not parts:
        return ""
    return (f" (max(new node {parts['new_node']}s, old gang {parts['old_gang']}s) + restart "
            f"{parts['restart']}s)")


def _apart(facts: dict[str, Any]) -> str:
    step = facts.get("numerics_apart_at_step")
    if step is None:
        return ""
    return (f"; from step {step} uninterrupted runs on the full and the smallest gang differ by up to "
            f"{facts['straight_runs_max_rel_diff']:.1e} themselves (rounding): not judged there, this run "
            f"{facts['loss_max_rel_diff_all_steps']:.1e}")


def _pct(share: float | None) -> str:
    return "?" if share is None else f"{share:.0%}"


def print_summary(console: Console, s: report.Summary) -> None:
    table = Table(title="spotrelay demo summary", show_header=False)
    table.add_column("what", no_wrap=True)
    table.add_column("value", overflow="fold")  # (paths and URIs wrap whole: a cut "mlflow.…" cannot be copied)
    table.add_row("result", "[bold green]OK[/]" if s.ok else "[bold red]PROBLEMS[/]")
    table.add_row("job", f"{s.job_id} {s.status} after {s.attempts} attempt(s), {s.wall_s:.0f}s")
    table.add_row("faults", f"{s.interruptions} spot notice(s), {s.node_losses} unannounced node loss(es)")
    table.add_row("steps lost", str(s.steps_lost))
    if s.elastic:
        table.add_row("elastic", f"world sizes by attempt {s.elastic['world_sizes']} nodes; "
                                 f"{s.elastic['losses_compared']} step losses within "
                                 f"{s.elastic['loss_max_rel_diff']:.1e} (relative) of the reference"
                                 + _apart(s.elastic))
    for r in s.recoveries:
        if r["downtime_s"] is None:
            table.add_row(f"downtime after {r['kind']}", "training did not resume (not measured)")
        else:
            table.add_row(
                f"downtime after {r['kind']}",
                f"{r['downtime_s']}s here (training stopped -> resumed at full size); {r['downtime_modeled_s']}s "
                f"with the modeled 300 s boot and a 120 s window{_parts(r['downtime_modeled_parts_s'])}; "
                f"resumed from step {r['resumed_from_step']}",
            )
        if r["kind"] == "spot-notice":
            trained = r["trained_through_notice_steps"]
            table.add_row(
                "  notice window",
                (f"trained {trained} steps after the notice at step {r['at_step']}; " if trained is not None else "")
                + f"{_pct(r['notice_training_share'])} of the {r['notice_window_s']:.0f}s window here, "
                f"{_pct(r['notice_training_share_modeled'])} of 120 s modeled; final save committed "
                f"{r['final_commit_before_reclaim_s']}s before the reclaim",
            )
    for name, t in s.targets.items():
        mark = {True: "[green]met[/]", False: "[red]missed[/]", None: "not measured"}[t["met"]]
        table.add_row(f"target {name}", f"{t['value']} (target {t['target']}): {mark}")
    ident = {True: "[green]bit-identical[/]", False: "[red]DIFFERENT[/]", None: "not checked"}[s.bit_identical]
    table.add_row("final model vs reference", f"{ident} (sha256 {str(s.final_state_sha256)[:16]}...)")
    table.add_row("losses vs reference", f"{s.losses_compared} steps compared, identical: {s.losses_identical}")
    table.add_row("cost", ", ".join(f"{k}={v}" for k, v in s.cost.items()))
    table.add_row("timeline", str(s.timeline_png))
    table.add_row("MLflow", f"run {s.mlflow_run_id} in {s.mlflow_tracking_uri}")
    if s.mlflow_lineage:
        runs = ", ".join(f"{name} ({why or 'running'})" for name, why in s.mlflow_lineage["attempt_runs"])
        table.add_row("MLflow lineage", f"{runs}; {s.mlflow_lineage['loss_points']} loss points across them")
    for p in s.problems:
        table.add_row("[red]problem[/]", p)
    console.print(table)
