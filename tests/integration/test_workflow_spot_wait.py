"""The wait for spot in a job-run execution (moto's Step Functions, our handlers): with
``recovery.spot_wait_minutes`` unset, a job whose spot pools all refuse waits (the PoolCooldown state)
for up to 120 minutes of Plan's clock, then launches on on-demand. ``WorkflowTimings.time_scale`` is
how the twin runs that wait at its boot scale (docs/local-twin.md, "Time")."""

from __future__ import annotations

from tests.integration.controller_doubles import CAPACITY, new_job
from tests.integration.test_workflow_job_run import FAST, Harness, wf

__all__ = ["wf"]


def test_the_wait_for_spot_runs_at_the_time_scale_then_on_demand(wf: Harness) -> None:
    wf.compute._fail = lambda pool, n: CAPACITY if pool.market == "spot" else None
    job = new_job(wf.store)  # spot_wait_minutes unset: up to 120 min for a spot pool that saves
    # 120 min -> 7.2 s of the clock, re-checked every second. Unscaled, Plan's first wait alone is
    # 300 s (and the gang would come after 2 h): agents_ready's hang bound ends the test first
    arn = wf.start(job, FAST.model_copy(update={"time_scale": 0.001}))
    nodes = wf.agents_ready(1)
    assert "PoolCooldown" in wf.states_entered(arn)  # it did wait for spot ...
    assert wf.job().attempts[0].pool.market == "on-demand"  # type: ignore[union-attr]  # ... then fell back
    first_od = next(i for i, k in enumerate(wf.compute.tried) if k.endswith("/on-demand"))
    assert first_od > 0 and all(k.endswith("/spot") for k in wf.compute.tried[:first_od])
    wf.exit_all(nodes, 0)
    assert wf.finished(arn)["status"] == "SUCCEEDED"
