"""EC2 bills a Linux spot instance it interrupts in its first hour nothing (EC2 User Guide, "Billing
for interrupted Spot Instances"), and spotrelay leaves such an instance, noticed and released, for EC2
to take instead of terminating it (domain/cost.py ``leave_to_ec2``): the simulator bills both as AWS
would, on the demo's scenario, and bills the same instances per second once their first hour is past."""

from __future__ import annotations

from spotrelay.domain.cost import CostLedger
from spotrelay.sim.records import Fault
from tests.unit.test_sim_calibration import demo_run

FAULTS = (Fault("notice", rank=1, step=20, attempt=1), Fault("kill", rank=0, step=45, attempt=2))


def _billed(run: object, node: object) -> float:
    return node.pool.price(node.launch_t) * (node.end_t - node.launch_t) / 3600.0  # type: ignore[attr-defined]


def test_first_hour_interruptions_cost_nothing_and_the_noticed_node_is_left_to_ec2() -> None:
    run = demo_run(FAULTS)
    assert run.metrics.finished
    noticed = [n for n in run.launched if n.instance_id in run.ec2_noticed]
    lost = [n for n in run.launched if n.state == "LOST"]
    assert len(noticed) == 1 and len(lost) == 1
    # released when its ranks exited after the save, but ended only when EC2 took it
    assert noticed[0].left_to_ec2 and noticed[0].end_t == noticed[0].removal_t
    free = {id(noticed[0]), id(lost[0])}
    want = sum(_billed(run, n) for n in run.launched if id(n) not in free)
    cost = CostLedger(entries=tuple(run.entries)).cost_so_far(run.now)
    assert want > 0 and abs(cost - want) < 1e-6


def test_past_the_first_hour_every_second_is_billed_and_a_released_node_is_terminated() -> None:
    run = demo_run(FAULTS, step_s=400.0)  # step 20 is past 2 h into the attempt
    assert run.metrics.finished
    noticed = [n for n in run.launched if n.instance_id in run.ec2_noticed]
    assert len(noticed) == 1 and not noticed[0].left_to_ec2 and noticed[0].end_t < noticed[0].removal_t
    cost = CostLedger(entries=tuple(run.entries)).cost_so_far(run.now)
    assert abs(cost - sum(_billed(run, n) for n in run.launched)) < 1e-6
