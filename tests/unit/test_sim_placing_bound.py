"""recovery.max_placing_minutes in the simulator: the shipped bound (services/plan.placing_overdue),
reached through the ASL's Plan -> FailJob path. A 32-node gang on spot only never fits a pool of
the g4dn trace (24 nodes at most): unbounded it waits in PLACING until the horizon; bounded it fails
after the bound, having launched nothing."""

from __future__ import annotations

from pathlib import Path

from spotrelay.sim.build import MarketOptions, build_market
from spotrelay.sim.job import JobModel
from spotrelay.sim.runner import SimOptions, make_run, measure

TRACE = str(Path(__file__).resolve().parents[2] / "spotrelay" / "local" / "data" / "bamboo-g4dn-trace.csv")


def _run(**switches: object) -> tuple[object, object]:
    opts = SimOptions(market=MarketOptions(traces=[TRACE]), job=JobModel(nodes=32, job_hours=24.0),
                      policies=("spotrelay",), spotrelay_switches={"markets": ("spot",), **switches})
    run = make_run("spotrelay", opts, build_market(opts.market, 0), 0, 0.0)
    run.start()  # type: ignore[attr-defined]
    run.loop()
    return run, measure("spotrelay", 0, run)


def test_a_job_no_pool_takes_fails_after_max_placing_minutes() -> None:
    run, result = _run(max_placing_minutes=90)
    assert run.metrics.failed_reason == ("job sim has had no training gang for 90 minutes "  # type: ignore[attr-defined]
                                         "(recovery.max_placing_minutes 90): no allowed pool took it in time")
    assert not result.finished and result.values["cost_usd"] == 0.0  # type: ignore[attr-defined]
    assert 1.5 <= result.values["wall_hours"] < 1.6  # type: ignore[attr-defined]  # the bound, then the next Plan


def test_unbounded_it_waits_for_capacity_past_the_bound() -> None:
    run, result = _run()
    assert run.metrics.failed_reason == "did not finish within the simulated horizon"  # type: ignore[attr-defined]
    assert result.values["wall_hours"] > 24  # type: ignore[attr-defined]
