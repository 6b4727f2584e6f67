"""The agent's port, controller side: the events that replaced the agent's own writes to its node
item (NodeReady with rank 0's port, TrainingStarted, NoticeSeen, DirectiveSeen, TrackingStarted)
through on_agent_event against moto. The handlers are the one writer; duplicates, late and
out-of-order events change nothing twice. The AWS adapter's reads and publishes, end to end."""

from __future__ import annotations

import json
import time
from datetime import datetime

from functions import on_agent_event, on_interruption_notice
from spotrelay.adapters.aws import client
from spotrelay.adapters.aws_agent_port import AwsAgentPort
from spotrelay.contracts.agent import node_id_for, rank0_address
from spotrelay.contracts.events import AGENT_SOURCE, Directive, DirectiveKind, TrainingStarted, parse_agent_event
from spotrelay.domain.models import NodeState
from spotrelay.domain.status import JobStatus
from tests.integration.controller_doubles import Env, agent_event, ctx, ec2_event, env, running_job

__all__ = ["env"]


def test_ready_with_rank0_port_and_training_started_in_any_order(env: Env) -> None:
    job, gang = running_job(env.store, env.compute, status=JobStatus.STARTING, tokens={"ready": "tok-ready"})
    out = on_agent_event.handler(agent_event("NodeReady", gang[0], master_port=29611), ctx())
    assert out["result"] == "applied" and out["settled"] is None
    # rank 1's NodeReady is late: its TrainingStarted counts as up, and ends the ready wait
    assert on_agent_event.handler(agent_event("TrainingStarted", gang[1]), ctx())["settled"] == "ready"
    late = on_agent_event.handler(agent_event("NodeReady", gang[1], private_ip="10.0.1.99"), ctx())
    assert late["result"] == "applied"  # the address, not the state: READY does not undo RUNNING
    nodes = {n.rank: n for n in env.store.nodes_of(job.job_id)}
    assert (nodes[0].state, nodes[0].master_port) == (NodeState.READY, 29611)
    assert (nodes[1].state, nodes[1].private_ip) == (NodeState.RUNNING, "10.0.1.99")
    assert [c[1] for c in env.workflow.completed] == ["tok-ready"]
    again = on_agent_event.handler(agent_event("TrainingStarted", gang[1]), ctx())
    assert again["result"] == "no-op"


def test_a_final_state_is_never_undone(env: Env) -> None:
    job, gang = running_job(env.store, env.compute)
    env.store.update_node(job.job_id, "a1-r1", lambda n: n.model_copy(update={"state": NodeState.TERMINATED}))
    for kind in ("NodeReady", "TrainingStarted"):
        assert on_agent_event.handler(agent_event(kind, gang[1]), ctx())["result"] == "no-op"
    assert env.store.get_node(job.job_id, "a1-r1").state is NodeState.TERMINATED


def test_node_ready_of_the_attempt_being_launched(env: Env) -> None:
    """provision writes the new attempt's node records before the job moves to it: a fast agent's
    NodeReady in between is recorded, not dropped as late (the ready wait then settles at once)."""
    job, gang = running_job(env.store, env.compute)
    nxt = env.store.put_node(gang[0].model_copy(update={"node_id": node_id_for(2, 0), "attempt": 2, "version": 0,
                                                         "state": NodeState.PENDING}))
    assert on_agent_event.handler(agent_event("NodeReady", nxt), ctx())["result"] == "applied"
    assert env.store.get_node(job.job_id, "a2-r0").state is NodeState.READY
    too_far = nxt.model_copy(update={"node_id": node_id_for(3, 0), "attempt": 3})
    env.store.put_node(too_far.model_copy(update={"version": 0}))
    assert on_agent_event.handler(agent_event("NodeReady", too_far), ctx())["result"] == "ignored"
    assert on_agent_event.handler(agent_event("TrainingStarted", nxt), ctx())["result"] == "ignored"


def test_directive_seen_clears_only_that_directive_of_any_attempt(env: Env) -> None:
    job, gang = running_job(env.store, env.compute)
    stop = Directive(directive_id="stop-1", kind=DirectiveKind.STOP, issued_at=time.time())
    env.store.update_node(job.job_id, "a1-r0", lambda n: n.model_copy(update={"directive": stop.model_dump()}))
    other = on_agent_event.handler(agent_event("DirectiveSeen", gang[0], directive_id="stop-0"), ctx())
    assert other["result"] == "no-op" and env.store.get_node(job.job_id, "a1-r0").directive is not None
    assert on_agent_event.handler(agent_event("DirectiveSeen", gang[0], directive_id="stop-1"), ctx())[
        "result"] == "applied"
    assert env.store.get_node(job.job_id, "a1-r0").directive is None
    # a survivor carried into attempt 2 takes its RESTART before the job is on attempt 2
    restart = Directive.restart(job.job_id, 2, 0, time.time(), "carried")
    carried = env.store.put_node(gang[0].model_copy(update={
        "node_id": "a2-r0", "attempt": 2, "version": 0, "state": NodeState.PENDING,
        "directive": restart.model_dump(mode="json")}))
    seen = agent_event("DirectiveSeen", carried, directive_id=restart.directive_id, directive_kind="RESTART")
    assert on_agent_event.handler(seen, ctx())["result"] == "applied"
    assert env.store.get_node(job.job_id, "a2-r0").directive is None
    impostor = agent_event("DirectiveSeen", gang[1], directive_id="x", node_id="a1-r0")  # another instance
    assert on_agent_event.handler(impostor, ctx())["result"] == "ignored"


def test_notice_seen_alone_dooms_and_directs_like_the_ec2_event(env: Env) -> None:
    """Either path alone is enough: the agent's NoticeSeen does what the EC2 warning does (the pool
    is cooled by the EC2 event only); the EC2 warning that follows changes nothing twice."""
    job, gang = running_job(env.store, env.compute, tokens={"outcome": "tok-out"})
    event = ec2_event("ec2_spot_interruption_warning.json", gang[0].instance_id)
    notice_time = datetime.fromisoformat(event["time"].replace("Z", "+00:00")).timestamp()
    seen = on_agent_event.handler(agent_event("NoticeSeen", gang[0], action_time=notice_time + 120), ctx())
    assert seen["result"] == "applied" and seen["directives"] == 2
    nodes = {n.rank: n for n in env.store.nodes_of(job.job_id)}
    assert nodes[0].state is NodeState.DOOMED and nodes[0].reclaim_at == notice_time + 120
    assert {n.directive["kind"] for n in nodes.values() if n.directive} == {"CHECKPOINT_NOW"}
    assert env.store.get_job(job.job_id).status is JobStatus.CHECKPOINTING
    assert env.stats.all() == {}
    versions = [n.version for n in env.store.nodes_of(job.job_id)]
    again = on_agent_event.handler(agent_event("NoticeSeen", gang[0], action_time=notice_time + 120), ctx())
    assert again["directives"] == 0
    warned = on_interruption_notice.handler(event, ctx())
    assert warned["directives"] == 0  # the same directive id: nothing sent twice
    assert [n.version for n in env.store.nodes_of(job.job_id)] == versions
    assert env.stats.all()[gang[0].pool.key].interruptions == 1


def test_notice_seen_by_a_spare_takes_it_off_the_bench(env: Env) -> None:
    job, gang = running_job(env.store, env.compute)
    spare = env.store.put_node(gang[1].model_copy(update={"node_id": "a1-r2", "rank": 2, "spare": True,
                                                           "instance_id": "i-0spare", "version": 0}))
    assert on_agent_event.handler(agent_event("NoticeSeen", spare), ctx())["node_state"] == "DOOMED"
    assert env.store.get_job(job.job_id).status is JobStatus.RUNNING  # the gang is not touched
    # EC2's reclaim is recorded: released in its first hour, the spare is left to EC2 (unbilled)
    assert env.store.get_node(job.job_id, "a1-r2").ec2_reclaim_at is not None


def test_tracking_started_records_the_first_run_id(env: Env) -> None:
    job, gang = running_job(env.store, env.compute)
    first = agent_event("TrackingStarted", gang[0], mlflow_run_id="run-1")
    assert on_agent_event.handler(first, ctx())["result"] == "applied"
    assert on_agent_event.handler(agent_event("TrackingStarted", gang[0], mlflow_run_id="run-2"), ctx())[
        "result"] == "no-op"
    assert env.store.get_job(job.job_id).mlflow_run_id == "run-1"
    stranger = agent_event("TrackingStarted", gang[0], mlflow_run_id="run-3", instance_id="i-0stranger")
    assert on_agent_event.handler(stranger, ctx())["result"] == "ignored"


def test_aws_adapter_reads_the_records_and_publishes_on_the_bus(env: Env) -> None:
    """The agent's side of the port on moto: views of the controller's records, events on the bus."""
    job, gang = running_job(env.store, env.compute)
    env.store.update_node(job.job_id, "a1-r0", lambda n: n.model_copy(update={
        "private_ip": "10.0.1.5", "master_port": 29777, "directive": {"directive_id": "d", "kind": "STOP",
                                                                        "issued_at": 1.0}}))
    sqs, events = client("sqs"), client("events")
    url = sqs.create_queue(QueueName="agent-port")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    events.put_rule(Name="agent-port", EventPattern=json.dumps({"source": [AGENT_SOURCE]}))
    events.put_targets(Rule="agent-port", Targets=[{"Id": "q", "Arn": arn}])
    port = AwsAgentPort(job.job_id)

    own = port.node("a1-r0")
    assert own is not None and own.directive == {"directive_id": "d", "kind": "STOP", "issued_at": 1.0}
    assert port.node("a9-r9") is None
    assert rank0_address(port.nodes(), 1) == ("10.0.1.5", 29777)
    view = port.job()
    assert view is not None and view.attempt == 1 and not view.terminal and view.attempts[0].pool is not None
    assert view.attempts[0].pool.key == gang[0].pool.key
    assert port.durable_root().startswith("s3://") and port.durable_root().endswith("checkpoints/")

    started = TrainingStarted(event_id="evt-started-1", job_id=job.job_id, node_id="a1-r1",
                              instance_id=gang[1].instance_id, attempt=1, rank=1, time=time.time())
    port.report(started)
    [message] = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5)["Messages"]
    body = json.loads(message["Body"])
    assert body["source"] == AGENT_SOURCE and parse_agent_event(body["detail"]) == started
