"""What the demo reports: the summary (faults, steps lost, recovery times, cost), the PNG timeline
and the MLflow record. Pure functions over what the demo recorded."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from spotrelay.local.market import MarketModel


@dataclass
class Fault:
    kind: str  # spot-notice | node-lost
    time: float
    node: str
    instance_id: str
    step: int | None  # the step training had reached when it happened
    attempt: int
    resumed_at: float | None = None  # first step of the next attempt finished
    resumed_from_step: int | None = None

    def recovery_s(self) -> float | None:
        return None if self.resumed_at is None else self.resumed_at - self.time


@dataclass
class Summary:
    ok: bool
    job_id: str | None
    status: str
    attempts: int
    interruptions: int  # spot notices
    node_losses: int  # unannounced
    steps_lost: int
    recoveries: list[dict[str, Any]]
    bit_identical: bool | None
    final_state_sha256: str | None
    reference_state_sha256: str | None
    losses_compared: int
    losses_identical: bool | None
    cost: dict[str, float]
    wall_s: float
    timeline_png: str | None
    mlflow_run_id: str | None
    mlflow_tracking_uri: str | None
    problems: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def recoveries(faults: list[Fault], market: MarketModel) -> list[dict[str, Any]]:
    """Wall-clock recovery per fault here, and with the modeled boot time in place of the scaled one."""
    out = []
    for f in faults:
        measured = f.recovery_s()
        modeled = None if measured is None else measured - market.boot_delay_s() + market.boot_time_s
        out.append(
            {
                "kind": f.kind,
                "node": f.node,
                "at_step": f.step,
                "attempt": f.attempt,
                "resumed_from_step": f.resumed_from_step,
                "recovery_s": None if measured is None else round(measured, 1),
                "recovery_with_modeled_boot_s": None if modeled is None else round(modeled, 1),
            }
        )
    return out


def costs(lifetimes: list[dict[str, Any]], market: MarketModel, faults: list[Fault], end: float) -> dict[str, float]:
    """USD for the instance time the twin used (boot, lost work and recovery included) at each pool's
    spot price, against the on-demand price for the same instance time, and what the faults cost
    (instance time from each fault to training running again)."""
    from spotrelay.domain.models import Pool

    spot = on_demand = 0.0
    node_s = 0.0
    for life in lifetimes:
        region, az, itype, market_kind = life["pool"].split("/")
        pool = Pool(region=region, az=az, instance_type=itype, market=market_kind)
        seconds = (life["ended_at"] or end) - life["launched_at"]
        node_s += seconds
        spot += market.quote(pool).price_per_hour * seconds / 3600
        on_demand += market.on_demand_price(itype, region) * seconds / 3600
    nodes = max((life["rank"] for life in lifetimes), default=0) + 1
    per_node_s = spot / node_s if node_s else 0.0
    recovery = sum(f.recovery_s() or 0.0 for f in faults) * nodes * per_node_s
    return {
        "spot_usd": round(spot, 4),
        "on_demand_same_time_usd": round(on_demand, 4),
        "savings_vs_on_demand_pct": round(100 * (1 - spot / on_demand), 1) if on_demand else 0.0,
        "recoveries_usd": round(recovery, 4),
    }


def merged_losses(per_attempt: dict[int, dict[int, float]]) -> dict[int, float]:
    """Step -> loss from every attempt that reported; a later attempt's value for a re-run step wins."""
    out: dict[int, float] = {}
    for attempt in sorted(per_attempt):
        out.update(per_attempt[attempt])
    return out


def timeline_png(
    path: Path,
    reference: dict[int, float],
    per_attempt: dict[int, dict[int, float]],
    faults: list[Fault],
    lifetimes: list[dict[str, Any]],
    t0: float,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(11, 8), gridspec_kw={"height_ratios": [3, 2]})
    if reference:
        steps = sorted(reference)
        ax1.plot(steps, [reference[s] for s in steps], color="0.6", lw=3, label="uninterrupted reference")
    colors = plt.get_cmap("tab10")
    for n, attempt in enumerate(sorted(per_attempt)):
        pts = sorted(per_attempt[attempt].items())
        if pts:
            ax1.plot(
                [s for s, _ in pts],
                [v for _, v in pts],
                "o",
                ms=3,
                color=colors(n),
                label=f"attempt {attempt} (spotrelay)",
            )
    for f in faults:
        if f.step is not None:
            ax1.axvline(f.step, color="red" if f.kind == "node-lost" else "orange", ls="--")
            ax1.annotate(
                f.kind, (f.step, 1), xycoords=("data", "axes fraction"), rotation=90, va="top", ha="right", fontsize=8
            )
        if f.resumed_from_step is not None:
            ax1.axvline(f.resumed_from_step, color="green", ls=":")
            ax1.annotate(
                f"resume @ {f.resumed_from_step}",
                (f.resumed_from_step, 0),
                rotation=90,
                xycoords=("data", "axes fraction"),
                va="bottom",
                ha="left",
                fontsize=8,
            )
    ax1.set_xlabel("step")
    ax1.set_ylabel("loss")
    ax1.set_title("loss: spotrelay run (interrupted, recovered) over the uninterrupted reference")
    ax1.legend(loc="upper right", fontsize=8)

    ordered = sorted(lifetimes, key=lambda life: (life["launched_at"], life["rank"]))
    end = time.time()  # nodes still alive are drawn to now
    for y, life in enumerate(ordered):
        launched = life["launched_at"] - t0
        booted = (life["booted_at"] or life["launched_at"]) - t0
        ended = (life["ended_at"] or end) - t0
        ax2.barh(y, booted - launched, left=launched, color="0.8", hatch="//")
        color = "orange" if life["notice_at"] else "red" if life["end_reason"] == "killed" else "tab:blue"
        ax2.barh(y, max(ended - booted, 0.01), left=booted, color=color)
        if life["notice_at"]:
            ax2.plot(life["notice_at"] - t0, y, "v", color="black")
    ax2.set_yticks(range(len(ordered)))
    ax2.set_yticklabels(
        [
            f"a{life['attempt']}-r{life['rank']} {life['pool'].split('/')[1]} {life['pool'].split('/')[3]}"
            for life in ordered
        ],
        fontsize=8,
    )
    ax2.set_xlabel("seconds since the demo started (hatched: boot; orange: spot notice (marked); red: lost)")
    ax2.set_title("node lifetimes")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def log_to_mlflow(
    tracking_uri: str, run_id: str | None, experiment: str, summary: Summary, artifacts: list[Path]
) -> str:
    """Add the demo's summary to the job's MLflow run (the agent created it), or a new run."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    if run_id is None:
        exp_id = ensure_experiment(tracking_uri, experiment, artifacts[0].parent / "mlartifacts")
        run_id = client.create_run(exp_id, tags={"mlflow.runName": "spotrelay-demo"}).info.run_id
    metrics = {
        "demo_interruptions": summary.interruptions,
        "demo_node_losses": summary.node_losses,
        "demo_steps_lost": summary.steps_lost,
        "demo_attempts": summary.attempts,
        "demo_bit_identical": float(bool(summary.bit_identical)),
        **{f"cost_{k}": v for k, v in summary.cost.items()},
    }
    for key, value in metrics.items():
        client.log_metric(run_id, key, float(value))
    for path in artifacts:
        if path.exists():
            client.log_artifact(run_id, str(path))
    return run_id


def ensure_experiment(tracking_uri: str, name: str, artifact_dir: Path) -> str:
    """Create the experiment up front so its artifacts land under the demo's folder, not ./mlruns."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return str(exp.experiment_id)
    return str(client.create_experiment(name, artifact_location=artifact_dir.resolve().as_uri()))
