"""The simulator takes the twin's decisions on the demo's scenario (spotrelay/local/demo.py): a spot
notice on rank 1 when attempt 1 reaches step 20, rank 0 of attempt 2 lost without notice at step 45.

The twin's pools come from a twin run of `spotrelay demo` on the shipped defaults (replace-lost-nodes,
launch_at_notice; its plan log: attempt 1 in us-east-1a p5 spot; at the notice "keep 1 survivors in
us-east-1a p5 spot, launch ranks [1]", the only candidate the survivor's pool, since a cooldown does not
evict survivors); attempt 3 follows the same rule after the loss: the survivor stays, its pool too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from spotrelay.local.market import MarketModel
from spotrelay.placement import catalog
from spotrelay.sim.controller import SpotrelayRun
from spotrelay.sim.job import REF_NODES, JobModel
from spotrelay.sim.market import from_quotes
from spotrelay.sim.records import Fault
from spotrelay.spec.load import load_spec

TINY = Path(__file__).resolve().parents[2] / "examples" / "tiny.yaml"


def demo_run(faults: tuple[Fault, ...], step_s: float = 10.0, **switches: Any) -> SpotrelayRun:
    spec = load_spec(TINY)
    res = spec.resources
    twin = MarketModel(regions=res.regions)
    quotes = twin.quotes(res.regions, res.instance_types, [m.value for m in res.markets])
    on_demand = {(r, t): twin.on_demand_price(t, r) for r in res.regions for t in res.instance_types}
    market = from_quotes(quotes, on_demand, boot_s=twin.boot_time_s)
    # 2 nodes, 60 steps of 10 s on p5 (so every_steps=10 is 100 s), a 30 s notice like the twin's
    job = JobModel(nodes=res.nodes, steps=60, ref_step_s=step_s * res.nodes / REF_NODES,
                   checkpoint_minutes=10 * step_s / 60.0, notice_s=twin.notice_window_s,
                   checkpoint_bytes=50e6)  # the tiny model's checkpoint is tens of MB
    assert job.every_steps("p5.48xlarge") == spec.checkpoint.every_steps == 10 or step_s != 10.0
    run = SpotrelayRun(market, job, seed=0, regions=res.regions, instance_types=res.instance_types, spec=spec,
                       faults=faults, **switches)
    run.start()
    run.loop()
    return run


def test_demo_scenario_takes_the_twins_decisions() -> None:
    run = demo_run((Fault("notice", rank=1, step=20, attempt=1), Fault("kill", rank=0, step=45, attempt=2)))
    assert run.metrics.finished and run.metrics.failed_reason is None
    pools = [d["pool"] for d in run.decisions]
    assert [d["attempt"] for d in run.decisions] == [1, 2, 3]
    assert pools == ["us-east-1/us-east-1a/p5.48xlarge/spot"] * 3
    resumed = [d["resumed_from_step"] for d in run.decisions]
    # attempt 2 is launched at the notice, so the simulator's decision records the checkpoint committed
    # then (the notice's own saves land later; the twin's Attempt records what its trainers restored);
    # attempt 3 resumes from the last periodic checkpoint before the loss at 45
    assert resumed[0] == 0 and resumed[1] <= 22 and resumed[2] == 40
    assert run.metrics.interruptions == 2 and run.metrics.recoveries == 2
    assert run.metrics.steps_lost == 5  # 41..45 redone after the unannounced loss


def test_without_faults_one_attempt_in_the_best_pool() -> None:
    run = demo_run(())
    assert [d["pool"] for d in run.decisions] == ["us-east-1/us-east-1a/p5.48xlarge/spot"]
    assert run.metrics.steps_lost == 0 and run.metrics.interruptions == 0
    assert catalog.offered("us-east-1", "p5.48xlarge")


def _first_attempt_bill(run: SpotrelayRun) -> tuple[float, float]:
    """(attempt 1's cost in the ledger, its price x nodes x clock: every node billed)."""
    a = run.attempts[0]
    assert a.ended_at is not None and a.started_at is not None
    return a.cost, a.price_per_hour * a.nodes * (a.ended_at - a.started_at) / 3600.0


def test_the_twins_kill_is_a_crash_billed_but_ec2s_unannounced_reclaim_is_not(monkeypatch: Any) -> None:
    """As interruptions.instance_state: a spot node lost without a notice is EC2's interruption only when
    EC2's record says so (Compute.spot_reclaimed). The twin's kill is a crash: attempt 1 is billed for
    every node. A market reclaim whose notice never came (the same loss, not a crash) leaves the node's
    share out, as EC2 bills none of a spot instance it interrupts in its first hour."""
    kill = (Fault("kill", rank=0, step=45, attempt=1),)
    crash = demo_run(kill)
    cost, full = _first_attempt_bill(crash)
    assert crash.metrics.finished and crash.ec2_noticed == set() and cost == full

    scripted = SpotrelayRun._scripted_faults

    def by_ec2(self: SpotrelayRun) -> None:  # the same unannounced loss, taken by EC2 (no crash)
        scripted(self)
        for node in self.gang.values():
            node.crashed = False

    monkeypatch.setattr(SpotrelayRun, "_scripted_faults", by_ec2)
    taken = demo_run(kill)
    cost, full = _first_attempt_bill(taken)
    a = taken.attempts[0]
    gone = [n for n in taken.launched if n.instance_id in taken.ec2_noticed]
    assert taken.metrics.finished and len(gone) == 1 and gone[0].rank == 0 and gone[0].attempt == 1
    assert a.ended_at is not None and a.started_at is not None
    share = a.price_per_hour * (a.ended_at - max(a.started_at, gone[0].launch_t)) / 3600.0
    assert share > 0 and abs(cost - (full - share)) < 1e-9 * full
