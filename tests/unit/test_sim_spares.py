"""Hot spares in the simulator go through the shipped decisions (spotrelay/recovery/spares.py): booted
and billed with the gang, a spare takes the doomed rank without a launch, and the bench is refilled."""

from __future__ import annotations

from spotrelay.domain.models import Node, NodeState, Pool
from spotrelay.recovery.spares import spare_ranks_to_launch, spare_takeovers
from spotrelay.sim.records import Fault
from tests.unit.test_sim_calibration import demo_run

POOL = Pool(region="us-east-1", az="us-east-1a", instance_type="p5.48xlarge", market="spot")
OTHER = POOL.model_copy(update={"az": "us-east-1b"})


def node(rank: int, iid: str, pool: Pool = POOL, spare: bool = False) -> Node:
    return Node(job_id="j", node_id=f"n{rank}", attempt=1, rank=rank, instance_id=iid, pool=pool,
                state=NodeState.READY, spare=spare)


def test_spares_in_the_survivors_pool_take_the_lost_ranks_lowest_first() -> None:
    gang = [node(0, "i-0"), node(1, "i-1"), node(2, "i-2")]
    spares = [node(3, "i-s3", spare=True), node(4, "i-s4", OTHER, spare=True)]
    takes, released = spare_takeovers(spares, POOL, gang, keep=["i-1"], size=3)
    assert [(s.instance_id, r) for s, r in takes] == [("i-s3", 0)]  # ranks 0 and 2 lost, one spare here
    assert [s.instance_id for s in released] == ["i-s4"]
    assert spare_takeovers(spares, None, gang, ["i-1"], 3) == ([], spares)  # a new gang: all spares go
    # the refill: one spare wanted, the standing one takes a rank -> launch one, past the gang's ranks
    assert spare_ranks_to_launch(spares[:1], ["i-s3"], gang=3, wanted=1) == [3]
    assert spare_ranks_to_launch(spares[:1], [], gang=3, wanted=1) == []


def test_a_spare_takes_the_doomed_rank_without_a_launch() -> None:
    notice = (Fault("notice", rank=1, step=20, attempt=1),)
    plain = demo_run(notice)
    spared = demo_run(notice, spec_overrides={"resources": {"spares": 1}}, timeline=True)
    assert spared.metrics.finished and plain.metrics.finished
    first = [n for n in spared.launched if n.launch_t == spared.start_t]
    assert len(first) == 3  # 2 ranks + 1 spare, one gang launch
    assert any("spare takes rank 1" in what for _, _, what in spared.metrics.timeline)
    refill = [n for n in spared.launched if n.launch_t > spared.start_t]
    assert len(refill) == 1 and refill[0].rank >= 2  # only a new spare was launched, past the gang's ranks
    # the spare is up: training resumes after the save and the restart, not after a boot
    assert spared.metrics.recovery_s[0] < plain.metrics.recovery_s[0]
    assert spared.paid_gpu_s > plain.paid_gpu_s  # the spare is billed while it stands by


def test_a_rebalance_standby_takes_the_rank_when_the_notice_follows() -> None:
    fault = (Fault("rebalance", rank=1, step=10, attempt=1, lead_s=100.0),)
    off = demo_run(fault, timeline=True)
    on = demo_run(fault, spec_overrides={"recovery": {"prewarm_on_rebalance": True}}, timeline=True)
    assert on.metrics.finished and off.metrics.finished
    assert "Prewarm" in on.walker.visited and "Prewarm" not in off.walker.visited
    assert any("spare takes rank 1" in what for _, _, what in on.metrics.timeline)
    assert on.metrics.recovery_s[0] < off.metrics.recovery_s[0]  # the standby booted before the notice


def test_a_new_gang_ready_before_the_old_ones_save_trains_when_an_old_rank_is_lost() -> None:
    # With spares (and launch at notice) the new gang can be ready while the old one still saves; an old
    # rank lost before that save stopped the old segment and voided the new gang's pending start, which
    # nothing scheduled again: the ready gang sat billed and untrained until its own reclaim (11% of the
    # paid GPU-hours on seed 1 of Bamboo's settings at 8 nodes, up to 7% on three more)
    from pathlib import Path

    from spotrelay.sim.build import MarketOptions
    from spotrelay.sim.job import JobModel
    from spotrelay.sim.runner import SimOptions, run_seed

    trace = Path(__file__).resolve().parents[2] / "spotrelay" / "local" / "data" / "bamboo-g4dn-trace.csv"
    market = MarketOptions(traces=[str(trace)], boot_s=45.0, on_demand_price=3.06, spot_price=0.91)
    opts = SimOptions(market=market, policies=("spotrelay",), job=JobModel(nodes=8, job_hours=48.0),
                      spotrelay_switches={"spares": 1})
    never_trained = [run_seed(opts, seed)[0].losses["never_trained"] for seed in range(8)]
    assert max(never_trained) < 0.02, never_trained
