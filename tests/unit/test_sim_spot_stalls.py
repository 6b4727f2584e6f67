"""A market whose spot gangs die before they train sends a job to on-demand, not to failure.

On the pessimistic reading of the g4dn trace (a job's nodes are trace nodes and die with them) a
16-node spot gang often loses a node within minutes of its boot. The stall budget
(``recovery.max_stalled_recoveries``, 10) fails a job after that many recoveries in a row with no newer
checkpoint; before ``spot_evidence.stall_limit`` a job could spend it all on spot gangs (seed 27 did)
while on-demand was allowed."""

from __future__ import annotations

from pathlib import Path

from spotrelay.sim.build import MarketOptions
from spotrelay.sim.job import JobModel
from spotrelay.sim.runner import SimOptions, run_seed

TRACE = str(Path(__file__).resolve().parents[2] / "spotrelay" / "local" / "data" / "bamboo-g4dn-trace.csv")


def test_every_job_finishes_where_spot_gangs_die_before_they_save() -> None:
    opts = SimOptions(market=MarketOptions(traces=[TRACE], trace_semantics="nodes"), policies=("spotrelay",),
                      job=JobModel(nodes=16, job_hours=72.0))
    failed = [seed for seed in range(40) if not run_seed(opts, seed)[0].finished]
    assert failed == []
