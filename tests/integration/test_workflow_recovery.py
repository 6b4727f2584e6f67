"""More job-run executions in moto: a node that never comes up (ready timeout), keeping survivors
(replace-lost-nodes), the user restart policy, and cancelling while waiting for capacity."""

from __future__ import annotations

from functools import partial

from functions import on_agent_event, on_instance_state
from spotrelay.domain.models import Node, NodeState
from spotrelay.domain.status import JobStatus
from spotrelay.services.cancel import request_cancel
from tests.integration.controller_doubles import CAPACITY, agent_event, ctx, ec2_event, load_event, new_job, wait_until
from tests.integration.test_workflow_job_run import FAST, Harness, wf

__all__ = ["wf"]


def _starting_gang(wf: Harness, after: int) -> list[Node] | None:
    job = wf.job()
    nodes = [n for n in wf.store.nodes_of(job.job_id) if n.attempt == job.attempt]
    return nodes if job.attempt > after and job.status is JobStatus.STARTING and nodes else None


def _settled(wf: Harness, attempt: int) -> bool:
    job = wf.job()
    return job.status is not JobStatus.STARTING or job.attempt != attempt


def _ready_whichever_attempt(wf: Harness, after: int) -> list[Node]:
    """Ready the gang of the attempt now starting (later than ``after``) until one runs. The 1 s
    ready timeout holds for every attempt of the execution: on a loaded machine a later gang's
    NodeReady can miss it too, and that attempt is replaced again (not what this test is about)."""
    while True:
        gang: list[Node] = wait_until(partial(_starting_gang, wf, after), what=f"an attempt after {after}")
        for node in gang:
            on_agent_event.handler(agent_event("NodeReady", node), ctx())
        attempt = gang[0].attempt
        wait_until(partial(_settled, wf, attempt), what=f"attempt {attempt} running or replaced")
        job = wf.job()
        if job.status is JobStatus.RUNNING and job.attempt == attempt:
            return sorted(gang, key=lambda n: n.rank)
        after = attempt


def test_ready_timeout_replaces_the_silent_node(wf: Harness) -> None:
    job = new_job(wf.store, max_recoveries=5)
    arn = wf.start(job, FAST.model_copy(update={"ready_timeout_s": 1}))
    first = wf.gang(1)
    on_agent_event.handler(agent_event("NodeReady", first[0]), ctx())  # rank 1 never reports
    second = _ready_whichever_attempt(wf, after=1)
    done = wf.job()
    assert done.attempts[0].end_reason == "node-lost" and done.recoveries == second[0].attempt - 1
    assert wf.store.get_node(job.job_id, "a1-r1").state is NodeState.TERMINATED
    assert not set(wf.compute.running(job.job_id)) & {n.instance_id for n in first}
    wf.exit_all(second, 0)
    assert wf.finished(arn)["status"] == "SUCCEEDED"
    assert "ReadyTimedOut" in wf.states_entered(arn)


def test_replace_lost_nodes_keeps_the_survivor(wf: Harness) -> None:
    job = new_job(wf.store, strategy="replace-lost-nodes")
    arn = wf.start(job)
    first = wf.agents_ready(1)
    on_instance_state.handler(ec2_event("ec2_instance_state_terminated.json", first[1].instance_id), ctx())
    second = wf.gang(2)
    assert second[0].instance_id == first[0].instance_id  # the survivor joins attempt 2
    assert second[0].directive is not None and second[0].directive["kind"] == "RESTART"
    assert second[1].instance_id != first[1].instance_id and second[1].pool == first[1].pool
    assert [r.ranks for r in wf.compute.launched] == [[0, 1], [1]]
    for node in second:
        on_agent_event.handler(agent_event("NodeReady", node), ctx())
    wait_until(lambda: wf.job().status is JobStatus.RUNNING, what="RUNNING again")
    wf.exit_all(second, 0)
    assert wf.finished(arn)["status"] == "SUCCEEDED"
    assert wf.compute.running(job.job_id) == []


def test_a_wave_of_losses_is_one_recovery(wf: Harness) -> None:
    # EC2 takes two nodes of the pool within seconds: the first loss ends the outcome wait, the second
    # lands while GatherLosses waits, and Recover sees both: one new attempt replaces ranks 1 and 2
    # (recovering on the first alone kept rank 2 as a survivor that was already gone)
    job = new_job(wf.store, strategy="replace-lost-nodes", nodes=3)
    arn = wf.start(job, FAST.model_copy(update={"loss_settle_s": 5}))
    first = wf.agents_ready(1)
    on_instance_state.handler(ec2_event("ec2_instance_state_terminated.json", first[1].instance_id), ctx())
    wait_until(lambda: "GatherLosses" in wf.states_entered(arn), what="the wait for the rest of the wave")
    assert "Recover" not in wf.states_entered(arn)
    on_instance_state.handler(ec2_event("ec2_instance_state_terminated.json", first[2].instance_id), ctx())
    second = wf.gang(2)
    assert second[0].instance_id == first[0].instance_id  # the survivor joins attempt 2
    assert [r.ranks for r in wf.compute.launched] == [[0, 1, 2], [1, 2]]
    for node in second:
        on_agent_event.handler(agent_event("NodeReady", node), ctx())
    wait_until(lambda: wf.job().status is JobStatus.RUNNING, what="RUNNING again")
    wf.exit_all(second, 0)
    assert wf.finished(arn)["status"] == "SUCCEEDED" and wf.job().recoveries == 1


def test_survivors_are_released_when_their_pool_has_no_capacity(wf: Harness) -> None:
    job = new_job(wf.store, strategy="replace-lost-nodes")
    arn = wf.start(job)
    first = wf.agents_ready(1)
    home = first[0].pool.key
    wf.compute._fail = lambda pool, n: CAPACITY if pool.key == home else None
    on_instance_state.handler(ec2_event("ec2_instance_state_terminated.json", first[1].instance_id), ctx())
    second = wf.agents_ready(2)
    assert {n.pool.key for n in second} != {home} and len(second) == 2
    assert not {n.instance_id for n in second} & {n.instance_id for n in first}
    assert set(wf.compute.running(job.job_id)) == {n.instance_id for n in second}
    assert wf.store.get_node(job.job_id, "a1-r0").state is NodeState.TERMINATED
    wf.exit_all(second, 0)
    assert wf.finished(arn)["status"] == "SUCCEEDED"


def test_user_error_follows_the_restart_policy(wf: Harness) -> None:
    job = new_job(wf.store, max_user_restarts=1)
    arn = wf.start(job)
    for attempt in (1, 2):
        nodes = wf.agents_ready(attempt)
        on_agent_event.handler(agent_event("TrainingExited", nodes[0], exit_code=1, reason="user-error"), ctx())
    assert wf.finished(arn)["status"] == "FAILED"
    final = wf.job()
    assert final.status is JobStatus.FAILED and final.user_restarts == 1 and final.recoveries == 0
    assert "max_user_restarts=1" in final.reasons[-1]
    assert wf.compute.running(job.job_id) == []


def test_a_refused_checkpoint_fails_the_job_once_with_the_message(wf: Harness) -> None:
    """Exit 80 (the agent saw the trainer's ``refused`` event): FAILED after one attempt, whatever the
    restart policy, the message in the reason, nothing left running."""
    job = new_job(wf.store, max_user_restarts=3)
    arn = wf.start(job)
    nodes = wf.agents_ready(1)
    why = "/c/step-00000004: saved under job spec aaa, this run's spec is bbb; resume with the spec that wrote it"
    on_agent_event.handler(agent_event("TrainingExited", nodes[0], exit_code=80, reason=f"refused: {why}",
                                       output_tail=why), ctx())  # fmt: skip
    wf.exit_all(nodes[1:], 1)  # the other rank dies of the broken collective
    assert wf.finished(arn)["status"] == "FAILED"
    final = wf.job()
    assert final.status is JobStatus.FAILED and final.attempt == 1 and final.user_restarts == 0
    assert "refused to start on rank 0 (exit 80)" in final.reasons[-1] and why in final.reasons[-1]
    assert "not retried" in final.reasons[-1]
    assert wf.compute.running(job.job_id) == []


def test_cancel_while_waiting_for_capacity(wf: Harness) -> None:
    wf.compute._fail = lambda pool, n: CAPACITY
    job = new_job(wf.store, spot_wait_minutes=0)  # unset, Plan would wait up to 2 h for spot before on-demand
    arn = wf.start(job, FAST.model_copy(update={"provision_retry_s": 2}))
    wait_until(lambda: len(wf.compute.tried) >= len(wf.market.prices), what="every pool refused")
    request_cancel(job.job_id, store=wf.store, workflow=wf.workflow, now=0.0, reason="no capacity anyway")
    assert wf.finished(arn)["status"] == "SUCCEEDED"
    assert wf.job().status is JobStatus.CANCELLED
    assert "CapacityBackoff" in wf.states_entered(arn) and "Cancel" in wf.states_entered(arn)


def test_silent_cluster_hits_the_heartbeat_timeout(wf: Harness) -> None:
    job = new_job(wf.store)
    arn = wf.start(job, FAST.model_copy(update={"heartbeat_s": 1}))
    first = wf.agents_ready(1)  # then silence: no Heartbeat events reach the outcome wait
    wf.gang(2)  # recovered into a new gang
    done = wf.job()
    assert done.attempts[0].end_reason == "node-lost"
    assert {wf.store.get_node(job.job_id, n.node_id).state for n in first} == {NodeState.TERMINATED}
    # AWS names a missed heartbeat States.HeartbeatTimeout (OutcomeTimedOut); moto reports it as a plain
    # States.Timeout, which goes to the placement review: it finds the gang silent and recovers the same way
    states = wf.states_entered(arn)
    assert "OutcomeTimedOut" in states or ("Review" in states and "Recover" in states)
    # attempt 2 would time out the same way; end the test deterministically
    request_cancel(job.job_id, store=wf.store, workflow=wf.workflow, now=0.0)
    assert wf.finished(arn)["status"] == "SUCCEEDED"
    assert wf.job().status is JobStatus.CANCELLED and wf.compute.running(job.job_id) == []


def test_crash_echoing_a_vanished_peer_is_a_loss_not_a_user_error(wf: Harness) -> None:
    job = new_job(wf.store)  # max_user_restarts=0: a user error would fail the job
    arn = wf.start(job)
    first = wf.agents_ready(1)
    wf.compute.terminate([first[1].instance_id], "us-east-1")  # gone; its state-change event is late
    on_agent_event.handler(agent_event("TrainingExited", first[0], exit_code=1, reason="collective broke"), ctx())
    second = wf.agents_ready(2)
    done = wf.job()
    assert done.attempts[0].end_reason == "node-lost" and done.user_restarts == 0 and done.recoveries == 1
    wf.exit_all(second, 0)
    assert wf.finished(arn)["status"] == "SUCCEEDED"


def test_over_budget_job_is_torn_down_and_failed(wf: Harness) -> None:
    from functions import reconcile

    job = new_job(wf.store)
    arn = wf.start(job)
    gang = wf.agents_ready(1)
    wait_until(lambda: "outcome" in wf.job().task_tokens, what="outcome wait registered")
    wf.store.update_job(job.job_id, lambda j: j.model_copy(update={
        "spec": {**j.spec, "budget": {"max_total_cost": 1}}, "cost_so_far": 5.0}))
    report = reconcile.handler(load_event("scheduled_event.json"), ctx())
    assert report["over_budget"] == [job.job_id]
    wf.exit_all(gang, 75)  # the ranks saved (services/stop.py); then the workflow fails the job
    assert wf.finished(arn)["status"] == "FAILED"
    final = wf.job()
    assert final.status is JobStatus.FAILED and final.reasons[-1].startswith("BudgetExceededError")
    assert final.reasons[0].startswith("budget: spent $") and final.reasons[0].endswith("of the $1.00 budget")
    assert wf.compute.running(job.job_id) == []


def test_a_job_no_pool_takes_fails_after_max_placing_minutes(wf: Harness) -> None:
    """Every launch refused: unbounded the execution loops CapacityBackoff -> Plan until cancelled
    (above); with recovery.max_placing_minutes Plan fails the job with the bound in its reason."""
    wf.compute._fail = lambda pool, n: CAPACITY
    job = new_job(wf.store, spot_wait_minutes=0, max_placing_minutes=0.05)  # 3 s without a gang
    arn = wf.start(job, FAST.model_copy(update={"provision_retry_s": 1}))
    assert wf.finished(arn)["status"] == "FAILED"
    final = wf.job()
    assert final.status is JobStatus.FAILED and final.reasons[-1].startswith("NoPlacementError")
    assert "had no training gang for 0 minutes (recovery.max_placing_minutes 0.05)" in final.reasons[-1]
    assert "CapacityBackoff" in wf.states_entered(arn) and "FailJob" in wf.states_entered(arn)
    assert wf.compute.running(job.job_id) == []


def test_the_workflow_goes_on_in_a_new_execution_before_its_history_fills(wf: Harness) -> None:
    """Step Functions ends an execution at 25,000 history events: after timings.max_hops passes through
    Plan or Review the job goes on in its next execution, at the same state with the same data
    (services/handover.py), and the job record follows it (the reconcile's stuck check reads it)."""
    job = new_job(wf.store)
    arn = wf.start(job, FAST.model_copy(update={"max_hops": 2}))
    first = wf.agents_ready(1)  # (pass 1: the first Plan)
    on_instance_state.handler(ec2_event("ec2_instance_state_terminated.json", first[1].instance_id), ctx())
    assert wf.finished(arn)["status"] == "SUCCEEDED"  # pass 2, after Recover: handed over
    assert wf.states_entered(arn)[-2:] == ["HandOverPlan", "HandedOver"]
    second = wf.agents_ready(2)  # the next execution planned and launched attempt 2
    following = wf.job().execution_arn
    assert following is not None and following.endswith(":job-under-test-h1-2")  # generation 1, at pass 2
    assert wf.states_entered(following)[:2] == ["Entry", "Plan"]
    wf.exit_all(second, 0)
    assert wf.finished(following)["status"] == "SUCCEEDED"
    done = wf.job()
    assert done.status is JobStatus.SUCCEEDED and done.attempt == 2 and done.recoveries == 1
