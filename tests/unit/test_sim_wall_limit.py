"""recovery.max_slowdown in the simulator: the shipped schedule (placement/spot_evidence.WallLimit) read
by Plan and the review. The fixed 16-node gang of the stated job on the g4dn trace restarts every ~28
minutes on spot and takes about 2.3x on-demand's wall time for its work; with a limit of 1.5 it mixes
spot and on-demand to finish within it, still cheaper than on-demand."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from spotrelay.sim.build import MarketOptions
from spotrelay.sim.job import JobModel
from spotrelay.sim.runner import SimOptions, job_starts, run_seed

TRACE = str(Path(__file__).resolve().parents[2] / "spotrelay" / "local" / "data" / "bamboo-g4dn-trace.csv")
WORK_H = 72.0


def _runs(**switches: Any) -> dict[str, Any]:
    opts = SimOptions(market=MarketOptions(traces=[TRACE]), job=JobModel(nodes=16, job_hours=WORK_H),
                      policies=("spotrelay", "on-demand"), spotrelay_switches=switches)
    return {r.policy: r for r in run_seed(opts, 0)}


def _values(**switches: Any) -> dict[str, dict[str, float]]:
    return {policy: r.values for policy, r in _runs(**switches).items()}


def test_the_runs_advice_names_the_limit_to_a_slow_job_without_it() -> None:
    """describe's advice over the run's records (services/describe.slowdown_line), as `simulate` prints it."""
    free = _runs()["spotrelay"]
    assert "recovery.max_slowdown keeps a job within a stated multiple" in (free.advice or "")
    assert "its committed training took 2." in (free.advice or "")  # ~2.3x on this trace
    bounded = _runs(max_slowdown=1.5)["spotrelay"]
    assert "recovery.max_slowdown" not in (bounded.advice or "")  # the job states it already


def test_a_job_keeps_within_its_max_slowdown_by_mixing_in_on_demand() -> None:
    free = _values()["spotrelay"]
    assert free["wall_hours"] > 2.0 * WORK_H and free["on_demand_share"] == 0.0  # cost alone: all spot, slow
    bounded = _values(max_slowdown=1.5)
    got, od = bounded["spotrelay"], bounded["on-demand"]
    # within the limit of on-demand's own wall time (its boot and restore: the schedule's grace)
    assert got["wall_hours"] <= 1.5 * od["wall_hours"] + 2.0
    # a mix, not a retreat: back to spot whenever on schedule (the review reads the running gang's commits)
    assert 0.1 < got["on_demand_share"] < 0.9
    assert free["cost_per_useful_gpu_hour"] < got["cost_per_useful_gpu_hour"] < od["cost_per_useful_gpu_hour"]


def test_a_calm_but_slow_spot_gang_is_moved_to_on_demand_by_the_review(tmp_path: Path) -> None:
    """No reclaim ever comes to catch it: p4d spot at a tenth of its price is the cheapest work, and a
    third as fast as the p5 gang on-demand would be; only the review's schedule check moves it."""
    table = tmp_path / "calm.csv"
    table.write_text("timestamp,region,availability_zone,instance_type,spot_price,interruptions_per_hour\n"
                     "0,us-east-1,us-east-1a,p4d.24xlarge,2.2,0\n0,us-east-1,us-east-1a,p5.48xlarge,50,0\n")

    def run(**switches: Any) -> dict[str, dict[str, float]]:
        opts = SimOptions(market=MarketOptions(trace_format="pools-csv", traces=[str(table)], regions=["us-east-1"]),
                          job=JobModel(nodes=4, job_hours=WORK_H), policies=("spotrelay", "on-demand"),
                          spotrelay_switches=switches)
        return {r.policy: r.values for r in run_seed(opts, 0)}

    free, bounded = run()["spotrelay"], run(max_slowdown=1.5)
    od = bounded["on-demand"]["wall_hours"]
    assert free["wall_hours"] > 2.5 * od and free["interruptions"] == 0  # p4d all along: 2.8x slower
    got = bounded["spotrelay"]
    assert got["wall_hours"] <= 1.5 * od and got["interruptions"] == 0 and got["recoveries"] > 0  # the moves
    assert got["cost_per_useful_gpu_hour"] < bounded["on-demand"]["cost_per_useful_gpu_hour"]


def test_the_simulators_schedule_starts_at_the_jobs_submission(monkeypatch: Any) -> None:
    """Plan and the review read the schedule from the run's job record as the services do: from its
    created_at (the job's start on the simulated clock), not its first gang's launch."""
    from spotrelay.placement import spot_wait
    from spotrelay.sim import moves

    seen: dict[str, set[float | None]] = {"plan": set(), "review": set()}
    given_up, keep = spot_wait.spot_given_up, moves.keep_to_schedule

    def plan_spy(*args: Any, **kw: Any) -> bool:
        seen["plan"].add(args[6] if len(args) > 6 else kw.get("since"))
        return given_up(*args, **kw)

    def review_spy(*args: Any, **kw: Any) -> Any:
        seen["review"].add(kw.get("since"))
        return keep(*args, **kw)

    monkeypatch.setattr(spot_wait, "spot_given_up", plan_spy)
    monkeypatch.setattr(moves, "keep_to_schedule", review_spy)
    opts = SimOptions(market=MarketOptions(traces=[TRACE]), job=JobModel(nodes=16, job_hours=12.0),
                      policies=("spotrelay",), spotrelay_switches={"max_slowdown": 1.5})
    run = run_seed(opts, 0)[0]
    starts = {r for k in seen for r in seen[k]}
    assert seen["plan"] and seen["review"] and len(starts) == 1  # one job: one submission time
    assert starts == {job_starts(0, 1)[0]} and run.values["wall_hours"] > 0  # the job's own start
