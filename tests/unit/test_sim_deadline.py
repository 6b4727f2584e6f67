"""A time-boxed job (JobModel.deadline_hours, ``simulate --deadline-hours``): every policy stops at the
deadline, its model is the steps it reached, and billing stops there too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from spotrelay.cli.main import app
from spotrelay.sim.build import MarketOptions
from spotrelay.sim.job import JobModel
from spotrelay.sim.runner import POLICIES, SimOptions, simulate

TRACE = str(Path(__file__).resolve().parents[2] / "spotrelay" / "local" / "data" / "bamboo-g4dn-trace.csv")


def _runs(job: JobModel) -> dict[str, dict[str, float]]:
    report = simulate(SimOptions(market=MarketOptions(traces=[TRACE]), job=job, policies=POLICIES))
    assert all(r.finished for r in report.runs), [(r.policy, r.failed) for r in report.runs]
    return {r.policy: r.values for r in report.runs}


def test_every_policy_stops_at_the_deadline_with_the_steps_it_reached() -> None:
    job = JobModel(nodes=8, job_hours=48.0, deadline_hours=24.0)
    runs = _runs(job)
    for policy, v in runs.items():
        assert v["wall_hours"] == pytest.approx(24.0), policy
        assert v["deadline_cut"] == 1.0 and 0 < v["useful_gpu_hours"] < 48.0 * 8 * 8, policy
    od = runs["on-demand"]
    # the on-demand gang trains the whole day but its boot and restore, and is billed for exactly the day
    full = 24.0 * job.nodes * 8
    assert 0.95 * full < od["useful_gpu_hours"] < full and od["steps_lost"] == 0
    per_node_hour = od["cost_usd"] / (24.0 * job.nodes)
    assert 55.0 < per_node_hour < 61.0  # the catalog's p5 on-demand price: no billing past the deadline
    assert runs["spotrelay"]["useful_gpu_hours"] > runs["skypilot-like"]["useful_gpu_hours"]


def test_a_deadline_past_the_work_changes_nothing() -> None:
    plain = _runs(JobModel(nodes=8, job_hours=12.0))
    late = _runs(JobModel(nodes=8, job_hours=12.0, deadline_hours=500.0))
    assert {p: v["deadline_cut"] for p, v in late.items()} == dict.fromkeys(POLICIES, 0.0)
    for policy in POLICIES:
        assert late[policy]["cost_usd"] == plain[policy]["cost_usd"], policy
        assert late[policy]["useful_gpu_hours"] == pytest.approx(12.0 * 8 * 8, rel=0.01), policy  # all of it


def test_simulate_deadline_hours(tmp_path: Path) -> None:
    out = tmp_path / "sim.json"
    result = CliRunner().invoke(app, ["simulate", "--trace", TRACE, "--nodes", "4", "--job-hours", "24",
                                      "--deadline-hours", "6", "--policies", "spotrelay,on-demand",
                                      "--json", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["assumptions"]["job"]["deadline_hours"] == 6.0
    assert doc["relative"]["on-demand"]["deadline_cut_share"] == 1.0
    assert doc["policies"]["on-demand"]["wall_hours"] == pytest.approx(6.0)
    assert "the deadline stopped 100% of its jobs" in result.output
    bad = CliRunner().invoke(app, ["simulate", "--trace", TRACE, "--deadline-hours", "0"])
    assert bad.exit_code == 2 and "--deadline-hours" in bad.output
