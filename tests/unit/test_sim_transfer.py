"""Checkpoints sent between regions are paid: a gang away from its checkpoints' bucket sends every save
there and reads its restores from there, at AWS's inter-region price (sim/training.py). Before, the
simulator charged nothing for it, which flattered policies that hop regions with a terabyte of state."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import tests.unit.test_sim_calibration as calibration
from spotrelay.sim.job import JobModel
from spotrelay.sim.records import Fault
from spotrelay.sim.runner import measure

DEMO = (Fault("notice", rank=1, step=20, attempt=1), Fault("kill", rank=0, step=45, attempt=2))
GB = 50e6 / 1e9  # the demo job's whole checkpoint (test_sim_calibration.demo_run)


def _demo(monkeypatch: pytest.MonkeyPatch, **fields: Any) -> Any:
    monkeypatch.setattr(calibration, "JobModel", lambda **kw: JobModel(**kw, **fields))
    return calibration.demo_run(DEMO)


def test_a_gang_away_from_its_checkpoints_pays_each_save_and_each_new_ranks_restore(
        monkeypatch: pytest.MonkeyPatch) -> None:
    run = _demo(monkeypatch, checkpoint_region="us-west-2", transfer_usd_per_gb=0.02)  # the gang: us-east-1
    assert {d["pool"].split("/")[0] for d in run.decisions} == {"us-east-1"}
    # attempt 1 (steps 0-21): saves at 10 and 20, the notice's flush at 21; attempt 2 restores 21 on one new
    # rank (the survivor reads its local tier), saves 30 and 40 before the loss at 45; attempt 3 restores
    # 40 on one new rank and saves 50 and 60
    saves, restores = 3 + 2 + 2, 2 * 0.5
    assert run.transfer_gb == pytest.approx((saves + restores) * GB)
    values = measure("spotrelay", 0, run).values
    assert values["transfer_usd"] == pytest.approx(run.transfer_gb * 0.02)
    free = _demo(monkeypatch, checkpoint_region="us-west-2", transfer_usd_per_gb=0.0)
    assert measure("spotrelay", 0, free).values["transfer_usd"] == 0.0
    assert values["cost_usd"] - measure("spotrelay", 0, free).values["cost_usd"] == pytest.approx(
        values["transfer_usd"])


def test_a_gang_beside_its_checkpoints_pays_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _demo(monkeypatch, checkpoint_region="us-east-1", transfer_usd_per_gb=0.02).transfer_gb == 0.0


def test_simulate_states_and_reports_it(tmp_path: Path) -> None:
    from spotrelay.cli.main import app

    out = tmp_path / "r.json"
    args = ["simulate", "--trace-format", "synthetic", "--nodes", "4", "--job-hours", "24",
            "--policies", "spotrelay,on-demand", "--json", str(out)]
    result = CliRunner().invoke(app, [*args, "--regions", "us-east-1,us-west-2"])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["assumptions"]["billing"]["checkpoint_region"] == "us-east-1"  # the first region: home
    assert doc["assumptions"]["billing"]["transfer_usd_per_gb"] == 0.0  # (not charged unless asked)
    assert all(v["transfer_usd"] == 0.0 for v in doc["policies"].values())
    assert "checkpoints in us-east-1" in result.output
    charged = CliRunner().invoke(app, [*args, "--regions", "us-west-2,us-east-1", "--transfer-usd-per-gb", "0.02"])
    assert charged.exit_code == 0, charged.output
    doc = json.loads(out.read_text())
    assert doc["assumptions"]["billing"]["checkpoint_region"] == "us-west-2"
    # the on-demand gang trains in us-east-1 (the same price, first in the catalog), away from its checkpoints
    assert doc["policies"]["on-demand"]["transfer_usd"] > 0
    assert "checkpoints sent between regions" in charged.output
    bad = CliRunner().invoke(app, [*args, "--checkpoint-region", "us-north-9"])
    assert bad.exit_code == 2 and "--checkpoint-region: unknown region 'us-north-9'" in bad.output
    assert len(bad.output.strip().splitlines()) == 1


def test_spotrelay_states_its_checkpoint_to_placement_only_when_the_run_charges_it() -> None:
    """The default runs decide as before (the pins hold); a charged run's spec says what a team with that
    checkpoint would state, so the shipped placement weighs the distance."""
    free = JobModel(nodes=16, checkpoint_region="us-east-1").spec(["us-east-1"], ["p5.48xlarge"], ["spot"])
    assert free.checkpoint.size_gb is None and free.checkpoint.region is None
    charged = JobModel(nodes=16, checkpoint_region="us-east-1", transfer_usd_per_gb=0.02).spec(
        ["us-east-1"], ["p5.48xlarge"], ["spot"])
    assert charged.checkpoint.size_gb == 1120.0 and charged.checkpoint.region == "us-east-1"


def test_the_review_and_recovery_shortlists_decide_as_every_quote_with_the_checkpoints_weighed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """sim/shortlist.py skips pools by lower bounds of their scores: the checkpoint term must not break them."""
    from spotrelay.sim import moves
    from spotrelay.sim.build import MarketOptions
    from spotrelay.sim.runner import SimOptions, simulate

    monkeypatch.setattr(moves, "VERIFY_SHORTLIST", True)
    opts = SimOptions(market=MarketOptions(trace_format="synthetic", synthetic_days=20),
                      job=JobModel(nodes=16, job_hours=72.0, transfer_usd_per_gb=0.02), policies=("spotrelay",),
                      jobs=2, spotrelay_switches={"min_nodes": 12, "spares": 1})
    report = simulate(opts)
    assert all(r.finished for r in report.runs)
