"""Recovery inside the notice window, in moto's Step Functions with our handlers: the replacements
launch at the notice (not after the ranks stopped), survivors keep their instances through the
pool's cooldown and rejoin, and the ranks left to drain commit their save and are released."""

from __future__ import annotations

import time

from functions import on_agent_event, on_instance_state, on_interruption_notice
from spotrelay.domain.models import NodeState
from spotrelay.domain.status import JobStatus
from spotrelay.services.controller import Controller
from spotrelay.services.reconcile import LEFT_TO_EC2_GRACE_S, reconcile
from tests.integration.controller_doubles import agent_event, ctx, ec2_event, new_job, wait_until
from tests.integration.test_workflow_job_run import Harness, wf

__all__ = ["wf"]


def _notice(wf: Harness, instance_id: str) -> None:
    notice = ec2_event("ec2_spot_interruption_warning.json", instance_id, at=time.time())  # (launched just now)
    assert on_interruption_notice.handler(notice, ctx())["result"] == "applied"


def test_replacement_launches_at_the_notice_and_the_survivor_rejoins(wf: Harness) -> None:
    job = new_job(wf.store, strategy="replace-lost-nodes", launch_at_notice=True)
    arn = wf.start(job)
    first = wf.agents_ready(1)
    on_agent_event.handler(agent_event("Heartbeat", first[0], step=40), ctx())
    survivor, doomed = first
    _notice(wf, doomed.instance_id)

    # nobody has stopped yet: the doomed rank's replacement is launched in the window
    second = wf.gang(2)
    assert [r.ranks for r in wf.compute.launched] == [[0, 1], [1]]
    assert second[0].instance_id == survivor.instance_id  # the pool's cooldown did not evict it
    assert second[0].directive is not None and second[0].directive["kind"] == "RESTART"
    assert second[1].pool == doomed.pool and second[1].instance_id != doomed.instance_id
    old = wf.store.get_node(job.job_id, "a1-r1")
    assert old.state is NodeState.DOOMED and old.release_after is not None  # left to finish its save
    assert doomed.instance_id in wf.compute.running(job.job_id)
    # reconcile leaves a draining rank alone
    ctl = Controller(store=wf.store, workflow=wf.workflow, compute=wf.compute)
    assert doomed.instance_id not in reconcile(ctl, now=old.release_after - 1)["orphans"]

    # the old gang commits the emergency save at the notice's step and stops
    on_agent_event.handler(agent_event("CheckpointCommitted", doomed, step=42, uri="s3://b/ckpt/step-42/",
                                       emergency=True), ctx())
    wf.exit_all(first, 75, last_step=42, last_committed_step=42)
    released = wf.store.get_node(job.job_id, "a1-r1")
    assert released.state is NodeState.TERMINATED  # released on exit
    # ... but EC2 noticed it in its first hour: left for EC2 to take (not billed), not terminated by us
    assert released.ec2_reclaim_at is not None and released.ec2_reclaim_at == old.reclaim_at
    assert doomed.instance_id in wf.compute.running(job.job_id)
    assert doomed.instance_id not in reconcile(ctl, now=released.ec2_reclaim_at + 1)["orphans"]
    # one EC2 never took is an orphan once its reclaim is LEFT_TO_EC2_GRACE_S past
    assert doomed.instance_id in reconcile(ctl, now=released.ec2_reclaim_at + LEFT_TO_EC2_GRACE_S + 1)["orphans"]
    assert doomed.instance_id not in wf.compute.running(job.job_id)
    on_instance_state.handler(ec2_event("ec2_instance_state_terminated.json", doomed.instance_id), ctx())

    for node in second:
        on_agent_event.handler(agent_event("NodeReady", node), ctx())
    wait_until(lambda: wf.job().status is JobStatus.RUNNING, what="RUNNING again")
    current = wf.job()
    assert current.last_checkpoint is not None and current.last_checkpoint.step == 42
    assert current.recoveries == 1 and current.steps_lost == 0
    assert current.attempts[0].end_reason == "interrupted"
    wf.exit_all(second, 0)
    assert wf.finished(arn)["status"] == "SUCCEEDED"
    assert wf.compute.running(job.job_id) == []


def test_a_new_gang_launches_at_the_notice_while_the_old_one_drains(wf: Harness) -> None:
    job = new_job(wf.store, strategy="replace-cluster", launch_at_notice=True)
    arn = wf.start(job)
    first = wf.agents_ready(1)
    _notice(wf, first[1].instance_id)
    second = wf.gang(2)
    assert second[0].pool != first[0].pool and len(wf.compute.launched) == 2
    assert set(wf.compute.running(job.job_id)) >= {n.instance_id for n in first}  # still saving
    wf.exit_all(first, 75, last_step=8, last_committed_step=8)
    # released on exit: the healthy rank terminated by us, the noticed one (its first hour) left to EC2
    assert set(wf.compute.running(job.job_id)) & {n.instance_id for n in first} == {first[1].instance_id}
    for node in second:
        on_agent_event.handler(agent_event("NodeReady", node), ctx())
    wait_until(lambda: wf.job().status is JobStatus.RUNNING, what="RUNNING again")
    wf.exit_all(second, 0)
    assert wf.finished(arn)["status"] == "SUCCEEDED"
