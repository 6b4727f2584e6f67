"""The left-to-EC2 path through the controller property test's machine, step by step: the random rules
rarely line up a running gang, EC2's notice and every rank's exit (test_controller_properties.py)."""

from __future__ import annotations

from spotrelay.domain.models import NodeState
from spotrelay.domain.status import JobStatus
from spotrelay.services import reconcile
from tests.integration.test_controller_properties import JOB, ControllerRun


def test_a_noticed_node_released_in_its_first_hour_runs_until_ec2_takes_it() -> None:
    """The path the random rules rarely line up: a running gang, EC2's notice, every rank exits, a new
    attempt; the noticed instance is left to EC2 (it runs, unbilled), the invariants hold, and reconcile
    terminates it once it outlives its reclaim by the grace."""
    m = ControllerRun()
    m.submit(nodes=2, fails=0, strategy="replace-cluster")
    for _ in range(10):
        m.workflow_step(False)
    for index in range(2):
        m.agent_event(index, "NodeReady", False, 0, 0, False)
    for _ in range(4):
        m.workflow_step(False)
    assert m._job().status is JobStatus.RUNNING
    m.notice_then_every_rank_exits(0, True)
    for _ in range(10):
        m.workflow_step(False)
    assert m._job().attempt == 2
    left = m.store.get_node(JOB, "a1-r0")
    assert left.state is NodeState.TERMINATED and left.ec2_reclaim_at is not None
    assert left.instance_id in m.compute.running(JOB)  # left for EC2 to take
    assert m.store.get_node(JOB, "a1-r1").instance_id not in m.compute.running(JOB)  # terminated by us
    m.one_live_attempt()
    m.now = left.ec2_reclaim_at + reconcile.LEFT_TO_EC2_GRACE_S + 1
    reconcile.reconcile(m.ctl, m.now, stale_after_s=1e9, regions=["us-east-1"], stuck_after_s=1e9)
    assert left.instance_id not in m.compute.running(JOB)
