"""The simulated review's move (sim/moves.py) takes the rules the services take."""

from __future__ import annotations

from spotrelay.domain.models import Pool
from spotrelay.sim.controller import SpotrelayRun
from spotrelay.sim.inputs import Trace, TraceNode
from spotrelay.sim.job import JobModel
from spotrelay.sim.market import Market, SimPool, TraceCapacity

SPOT = Pool(region="us-east-1", az="us-east-1a", instance_type="p5.48xlarge", market="spot")
ON_DEMAND = SPOT.model_copy(update={"market": "on-demand"})
# no spot capacity for the first hour (the gang starts on on-demand), then 8 nodes for good
LATE_SPOT = Trace("late", 1e8, tuple(TraceNode(3600.0, 1e8) for _ in range(8)))


def moved_run(boot_s: float) -> SpotrelayRun:
    spot = SimPool(pool=SPOT, key=SPOT.key, on_demand_price=55.0, spot_price=22.0, band=1, gpus=8,
                   capacity=TraceCapacity(LATE_SPOT, 0.0))
    od = SimPool(pool=ON_DEMAND, key=ON_DEMAND.key, on_demand_price=55.0, spot_price=None, band=None, gpus=8)
    market = Market(pools=[spot, od], unannounced_share=0.0, rebalance_share=0.0, boot_s=boot_s, boot_spread=0.0)
    run = SpotrelayRun(market, JobModel(nodes=2, job_hours=6.0), seed=0, regions=["us-east-1"],
                       instance_types=["p5.48xlarge"], timeline=True,
                       spec_overrides={"recovery": {"spot_wait_minutes": 0}})  # starts on on-demand, not waiting
    run.start()
    run.loop()
    return run


def test_a_moves_save_deadline_is_the_markets_expected_boot() -> None:
    """services/migrate.py times the old gang's save to the target pool's expected boot
    (Compute.expected_boot_s); the simulator asks its market's boot model the same question."""
    for boot_s in (45.0, 600.0):
        run = moved_run(boot_s)
        assert run.metrics.finished and run.metrics.moves >= 1
        assert run.voluntary, "the move left the on-demand gang with a save deadline"
        move_launches = {n.launch_t for n in run.launched if n.pool.key == SPOT.key}
        for deadline in run.voluntary.values():
            assert any(abs(deadline - (t + boot_s)) < 1e-6 for t in move_launches), (deadline, move_launches)
        assert run.market.expected_boot_s(SPOT) == boot_s
