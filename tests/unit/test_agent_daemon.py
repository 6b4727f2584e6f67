"""The agent's loop end to end on one node, fast: a fake IMDS, a temporary directory, the agent's port
in process (its events go through the controller's real handler into an in-memory job store: the
node records checked here were written by the controller, never by the agent), and a stand-in
trainer (no torch) that honours the control contract like agent/training.py.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.config import AgentConfig
from agent.daemon import Agent
from agent.imds import ImdsClient
from agent.launcher import LaunchPlan, Rendezvous
from agent.reporting import Reporter
from spotrelay.adapters.memory_job_store import MemoryJobStore
from spotrelay.contracts.events import Directive, DirectiveKind
from spotrelay.contracts.exit_codes import ExitCode
from spotrelay.domain.models import Job, Node, NodeState, Pool
from spotrelay.domain.status import JobStatus
from spotrelay.local.fake_imds import FakeImds
from spotrelay.spec.models import JobSpec
from tests.agent_port import InProcessAgentPort

# The stand-in trainer: one step every 0.1 s; acts on request.json like the training API does.
TRAINER = r"""
import json, os, sys, time
from pathlib import Path
from spotrelay.contracts import control
from spotrelay.contracts.health import HealthAnomaly
ctl = Path(os.environ[control.ENV_CONTROL_DIR])
mode, steps = sys.argv[1], int(sys.argv[2])
handled = set()
with open(ctl / "starts", "a") as fh:
    fh.write("x")
(ctl / "run_id").write_text(os.environ.get(control.ENV_MLFLOW_RUN_ID, ""))
if mode.startswith("stall"):
    from agent.hang import register_stack_dump
    register_stack_dump(ctl, 0)
first_start = (ctl / "starts").read_text() == "x"
def commit(step, emergency=False, deadline=None, request_id=None):
    control.append_event(ctl, control.TrainerEvent(kind="checkpoint_committed", step=step, uri=f"s3://b/step-{step}",
        duration_s=0.05, emergency=emergency, deadline=deadline, request_id=request_id, time=time.time()))
for step in range(1, steps + 1):
    time.sleep(0.1)
    control.write_progress(ctl, step)
    print(f"step {step}", flush=True)
    if step == 3 and (mode == "stall" or (mode == "stall-once" and first_start)):
        time.sleep(3600)  # stuck in a collective, say
    if step == 2 and mode == "anomaly":
        found = HealthAnomaly(kind="grad-explosion", action="notify", step=2, value=40.0, detail="grad norm 40x")
        control.append_event(ctl, control.TrainerEvent(kind="anomaly", step=2, anomaly=found, time=time.time()))
    request = control.read_request(ctl)
    if request is None or request.request_id in handled:
        continue
    handled.add(request.request_id)
    if request.kind == "stop":
        sys.exit(78)
    if mode == "hang":  # a save that never finishes
        time.sleep(3600)
    if request.kind == "checkpoint":
        commit(step, request_id=request.request_id)
    else:
        commit(step, emergency=True, deadline=request.deadline, request_id=request.request_id)
        sys.exit(75)
"""


SPEC = JobSpec.model_validate(
    {
        "version": 1,
        "name": "t",
        "entrypoint": {"script": "trainer.py"},
        "resources": {"nodes": 1, "gpus_per_node": 0},
        "checkpoint": {"every_steps": 100},
    }
)


def _rank0_node(**over: Any) -> Node:
    """Rank 0 of attempt 1 of job j-1 on a p5 spot node in us-east-1a."""
    pool = Pool(region="us-east-1", az="us-east-1a", instance_type="p5.48xlarge", market="spot")
    return Node(job_id="j-1", node_id="a1-r0", attempt=1, rank=0, pool=pool, **over)


@pytest.fixture
def imds() -> Iterator[FakeImds]:
    with FakeImds(instance_id="i-0node") as server:
        yield server


def run_agent(
    tmp_path: Path,
    imds: FakeImds,
    mode: str = "ok",
    steps: int = 30,
    spec: JobSpec = SPEC,
    log_sink: Any = None,
    launches: list[Rendezvous] | None = None,
    **over: Any,
) -> tuple[Agent, MemoryJobStore, InProcessAgentPort, threading.Thread, list[int]]:
    (tmp_path / "trainer.py").write_text(TRAINER)
    config = AgentConfig.model_validate(
        {
            "job_id": "j-1",
            "attempt": 1,
            "rank": 0,
            "nodes": 1,
            "instance_id": "i-0node",
            "private_ip": "127.0.0.1",
            "work_dir": tmp_path,
            "imds_endpoint": imds.url,
            "imds_poll_s": 0.1,
            "directive_poll_s": 0.1,
            "heartbeat_s": 0.5,
            "stop_grace_s": 1.0,
            "linger_s": 0,
            **over,
        }
    )
    job = Job(job_id="j-1", name="t", status=JobStatus.RUNNING, attempt=1, spec=spec.model_dump(mode="json"))
    port = InProcessAgentPort(job)
    store = port.store
    store.put_node(_rank0_node(instance_id="i-0node"))

    def plan(spec: JobSpec, rdzv: Rendezvous, env: dict[str, str], itype: str | None, python: str) -> LaunchPlan:
        # no torchrun: the per-rank wrapper straight on the stand-in trainer
        if launches is not None:
            launches.append(rdzv)
        return LaunchPlan(
            [sys.executable, "-m", "agent.launcher", str(tmp_path / "trainer.py"), mode, str(steps)],
            {**env, "RANK": "0", "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        )

    client = ImdsClient(imds.url, timeout_s=2.0, retries=1)  # generous: CI machines are loaded
    agent = Agent(config, port, Reporter(config, port), client, plan_builder=plan, log_sink=log_sink)
    view = port.job()
    assert view is not None
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(agent.serve(view, spec, track=True)), daemon=True)
    thread.start()
    return agent, store, port, thread, result


HANG_S = 300.0  # only catches a hang: a loaded CI machine may be slow, never this slow


def wait_for(predicate: Callable[[], bool], timeout: float = HANG_S) -> None:
    give_up = time.time() + timeout
    while not predicate():
        assert time.time() < give_up, f"condition not reached in {timeout}s (a hang)"
        time.sleep(0.05)


def finish(thread: threading.Thread, result: list[int]) -> int:
    thread.join(HANG_S)
    assert not thread.is_alive(), f"the agent did not return in {HANG_S}s (a hang)"
    return result[0]


def test_runs_to_done_with_registration_and_heartbeats(tmp_path: Path, imds: FakeImds) -> None:
    _, store, recorder, thread, result = run_agent(tmp_path, imds, steps=12)
    assert finish(thread, result) == ExitCode.DONE
    assert recorder.kinds()[0] == "NodeReady" and recorder.kinds()[-1] == "TrainingExited"
    assert recorder.of("Heartbeat") and recorder.of("Heartbeat")[-1]["step"] >= 1
    node = store.get_node("j-1", "a1-r0")
    assert node.state is NodeState.EXITED and node.exit_code == 0 and node.private_ip == "127.0.0.1"
    assert node.last_heartbeat is not None


def test_interruption_notice_saves_and_exits_75(tmp_path: Path, imds: FakeImds) -> None:
    _, store, recorder, thread, result = run_agent(tmp_path, imds)
    wait_for(lambda: bool(recorder.of("Heartbeat")))
    deadline = float(int(time.time()) + 100)
    imds.set_interruption("terminate", deadline)
    assert finish(thread, result) == ExitCode.PREEMPTED_SAVED
    [commit] = recorder.of("CheckpointCommitted")
    assert commit["emergency"] and commit["met_deadline"] and commit["deadline"] == deadline
    assert recorder.of("TrainingExited")[0]["last_committed_step"] == commit["step"]
    assert store.get_node("j-1", "a1-r0").exit_code == 75


def test_rebalance_checkpoints_and_training_continues(tmp_path: Path, imds: FakeImds) -> None:
    _, _, recorder, thread, result = run_agent(tmp_path, imds, steps=25)
    wait_for(lambda: bool(recorder.of("Heartbeat")))
    imds.set_rebalance()
    wait_for(lambda: bool(recorder.of("CheckpointCommitted")))
    assert finish(thread, result) == ExitCode.DONE
    [commit] = recorder.of("CheckpointCommitted")  # once, though IMDS kept showing the recommendation
    assert not commit["emergency"]
    assert not (tmp_path / "control" / "request.json").exists()


def test_stop_directive_cancels_and_is_cleared(tmp_path: Path, imds: FakeImds) -> None:
    _, store, recorder, thread, result = run_agent(tmp_path, imds)
    wait_for(lambda: bool(recorder.of("Heartbeat")))
    directive = Directive(directive_id="d-stop-1", kind=DirectiveKind.STOP, issued_at=time.time(), reason="cancel")
    store.update_node("j-1", "a1-r0", lambda n: n.model_copy(update={"directive": directive.model_dump()}))
    assert finish(thread, result) == ExitCode.CANCELLED
    assert store.get_node("j-1", "a1-r0").directive is None


def test_deadline_missed_kills_and_reports_unsaved(tmp_path: Path, imds: FakeImds) -> None:
    _, _, recorder, thread, result = run_agent(tmp_path, imds, mode="hang")
    wait_for(lambda: bool(recorder.of("Heartbeat")))
    imds.set_interruption("terminate", time.time() + 1.5)
    assert finish(thread, result) == ExitCode.PREEMPTED_UNSAVED
    [missed] = [a for a in recorder.of("Anomaly") if a["what"] == "deadline-missed"]
    assert "durable: nothing from this attempt" in missed["detail"]


def test_imds_down_is_reported_once_and_training_goes_on(tmp_path: Path, imds: FakeImds) -> None:
    _, _, recorder, thread, result = run_agent(tmp_path, imds, steps=30, imds_failures_anomaly=2)
    wait_for(lambda: bool(recorder.of("Heartbeat")))
    imds.set_up(False)
    wait_for(lambda: bool(recorder.of("Anomaly")))
    imds.set_up(True)
    assert finish(thread, result) == ExitCode.DONE
    assert [a["what"] for a in recorder.of("Anomaly")] == ["imds-unreachable"]


def test_sigterm_to_the_agent_saves_first(tmp_path: Path, imds: FakeImds) -> None:
    import signal

    agent, _, recorder, thread, result = run_agent(tmp_path, imds)
    wait_for(lambda: bool(recorder.of("Heartbeat")))
    agent.on_signal(signal.SIGTERM, None)
    assert finish(thread, result) == ExitCode.PREEMPTED_SAVED
    assert recorder.of("CheckpointCommitted")[0]["emergency"]


def test_restart_directive_relaunches_the_command(tmp_path: Path, imds: FakeImds) -> None:
    _, store, _, thread, result = run_agent(tmp_path, imds, steps=20)
    wait_for(lambda: (tmp_path / "control" / "starts").exists())  # the first run is under way
    directive = Directive(directive_id="d-restart-1", kind=DirectiveKind.RESTART, issued_at=time.time())
    store.update_node("j-1", "a1-r0", lambda n: n.model_copy(update={"directive": directive.model_dump()}))
    assert finish(thread, result) == ExitCode.DONE
    assert (tmp_path / "control" / "starts").read_text() == "xx"
    assert store.get_node("j-1", "a1-r0").directive is None


def test_survivor_joins_the_next_gang(tmp_path: Path, imds: FakeImds) -> None:
    _, store, recorder, thread, result = run_agent(tmp_path, imds, steps=20, linger_s=20)
    wait_for(lambda: bool(recorder.of("Heartbeat")))
    now = time.time()
    stop = Directive(directive_id="d-ckpt-1", kind=DirectiveKind.CHECKPOINT_NOW, deadline=now + 60, issued_at=now)
    store.update_node("j-1", "a1-r0", lambda n: n.model_copy(update={"directive": stop.model_dump()}))
    wait_for(lambda: bool(recorder.of("TrainingExited")))
    assert recorder.of("TrainingExited")[0]["exit_code"] == ExitCode.PREEMPTED_SAVED
    # the controller (replace-lost-nodes) carries this instance into attempt 2 as rank 0
    restart = Directive(directive_id="restart-j-1-a2", kind=DirectiveKind.RESTART, issued_at=time.time())
    carried = store.get_node("j-1", "a1-r0").model_copy(
        update={"node_id": "a2-r0", "attempt": 2, "state": NodeState.PENDING, "directive": restart.model_dump(),
                "version": 0, "exit_code": None}
    )
    store.put_node(carried)  # the record first, then the job moves to the attempt (as provision does)
    store.update_job("j-1", lambda j: j.model_copy(update={"attempt": 2}))
    assert finish(thread, result) == ExitCode.DONE
    assert [(e["attempt"], e["node_id"]) for e in recorder.of("NodeReady")] == [(1, "a1-r0"), (2, "a2-r0")]
    assert recorder.of("DirectiveSeen")[-1]["directive_id"] == "restart-j-1-a2"
    node = store.get_node("j-1", "a2-r0")  # the controller cleared the RESTART and recorded the exit
    assert node.directive is None and node.state is NodeState.EXITED and node.exit_code == 0
    assert node.master_port == 29500
    assert (tmp_path / "control" / "starts").read_text() == "xx"  # restarted once, not twice


def _stop_and_carry(store: MemoryJobStore, recorder: InProcessAgentPort, old: str, attempt: int, rank: int,
                    nodes: int) -> None:
    """CHECKPOINT_NOW to the node of ``old``; once it exited, the controller carries the instance into
    ``attempt`` as ``rank`` of a gang of ``nodes`` (the RESTART names the new size)."""
    now = time.time()
    exits = len(recorder.of("TrainingExited"))
    stop = Directive(directive_id=f"d-ckpt-{old}", kind=DirectiveKind.CHECKPOINT_NOW, deadline=now + 60, issued_at=now)
    store.update_node("j-1", old, lambda n: n.model_copy(update={"directive": stop.model_dump()}))
    wait_for(lambda: len(recorder.of("TrainingExited")) > exits)
    restart = Directive.restart("j-1", attempt, rank, time.time(), "resize", world_size=nodes)
    store.put_node(store.get_node("j-1", old).model_copy(update={
        "node_id": f"a{attempt}-r{rank}", "attempt": attempt, "rank": rank, "state": NodeState.PENDING,
        "directive": restart.model_dump(), "version": 0, "exit_code": None}))
    store.update_job("j-1", lambda j: j.model_copy(update={"attempt": attempt}))


def test_survivor_restarts_at_the_gang_size_the_restart_names(tmp_path: Path, imds: FakeImds) -> None:
    """Elastic resize, node side: a 2-node gang shrinks to 1 node, then the next attempt grows back to
    2; the launcher is rebuilt each time with the new node count and this node's new rank."""
    launches: list[Rendezvous] = []
    _, store, recorder, thread, result = run_agent(tmp_path, imds, steps=40, linger_s=60, launches=launches,
                                                   nodes=2)
    wait_for(lambda: bool(recorder.of("Heartbeat")))
    _stop_and_carry(store, recorder, "a1-r0", attempt=2, rank=0, nodes=1)
    wait_for(lambda: len(launches) == 2 and bool(store.get_node("j-1", "a2-r0").state is NodeState.RUNNING))
    _stop_and_carry(store, recorder, "a2-r0", attempt=3, rank=0, nodes=2)
    assert finish(thread, result) == ExitCode.DONE
    assert [(r.nodes, r.node_rank) for r in launches] == [(2, 0), (1, 0), (2, 0)]
    assert [e["attempt"] for e in recorder.of("NodeReady")] == [1, 2, 3]
    assert store.get_node("j-1", "a3-r0").directive is None


def test_agent_never_undoes_the_controllers_verdict(tmp_path: Path, imds: FakeImds) -> None:
    _, store, recorder, thread, result = run_agent(tmp_path, imds)
    wait_for(lambda: bool(recorder.of("Heartbeat")))
    stop = Directive(directive_id="d-stop-2", kind=DirectiveKind.STOP, issued_at=time.time())
    store.update_node(
        "j-1",
        "a1-r0",
        lambda n: n.model_copy(
            update={  # teardown marked it first
                "state": NodeState.TERMINATED,
                "directive": stop.model_dump(),
            }
        ),
    )
    assert finish(thread, result) == ExitCode.CANCELLED
    assert recorder.of("TrainingExited")[0]["exit_code"] == ExitCode.CANCELLED
    assert store.get_node("j-1", "a1-r0").state is NodeState.TERMINATED  # the exit changes a final state not


def test_rank1_waits_for_rank0_address_and_port_and_stops_on_sigterm(tmp_path: Path, imds: FakeImds) -> None:
    import signal

    from spotrelay.errors import SpotrelayError

    config = AgentConfig(job_id="j-1", attempt=1, rank=1, nodes=2, rank0_wait_s=30)
    port = InProcessAgentPort(Job(job_id="j-1", name="t", status=JobStatus.RUNNING, attempt=1))
    port.store.put_node(_rank0_node(instance_id="i-0", state=NodeState.READY, private_ip="10.0.0.7",
                                    master_port=29611))
    agent = Agent(config, port, Reporter(config, port), ImdsClient(imds.url), sleep=lambda s: None)
    assert agent.wait_for_rank0() == ("10.0.0.7", 29611)  # rank 0's published port, not ours (29500)
    port.store.update_node("j-1", "a1-r0", lambda n: n.model_copy(update={"state": NodeState.LOST}))
    agent.on_signal(signal.SIGTERM, None)
    with pytest.raises(SpotrelayError, match="signal"):
        agent.wait_for_rank0()


def test_mlflow_run_created_after_ready_and_handed_to_the_trainer(tmp_path: Path, imds: FakeImds) -> None:
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    spec = SPEC.model_copy(update={"tracking": SPEC.tracking.model_copy(update={"tracking_uri": uri})})
    _, store, recorder, thread, result = run_agent(tmp_path, imds, steps=8, spec=spec)
    assert finish(thread, result) == ExitCode.DONE
    run_id = store.get_job("j-1").mlflow_run_id  # recorded by the controller from TrackingStarted
    assert [e["mlflow_run_id"] for e in recorder.of("TrackingStarted")] == [run_id]
    assert run_id and (tmp_path / "control" / "run_id").read_text() == run_id
    assert recorder.kinds()[0] == "NodeReady"
    history = MlflowClient(tracking_uri=uri).get_metric_history(run_id, "exit_code")
    assert [m.value for m in history] == [0]


def _with_hang(action: str) -> JobSpec:
    health = {"hang_after_s": 1.0, "actions": {"hang": action}}
    return JobSpec.model_validate({**SPEC.model_dump(mode="json"), "health": health})


def test_hang_dumps_stacks_reports_and_stops_unhealthy(tmp_path: Path, imds: FakeImds) -> None:
    _, store, recorder, thread, result = run_agent(tmp_path, imds, mode="stall", spec=_with_hang("stop"))
    assert finish(thread, result) == ExitCode.UNHEALTHY
    [anomaly] = recorder.of("Anomaly")
    assert anomaly["what"] == "hang" and anomaly["health"]["action"] == "stop" and anomaly["health"]["step"] == 3
    assert "trainer.py" in anomaly["detail"]  # the stuck frame, from faulthandler in the trainer
    assert "trainer.py" in (tmp_path / "stacks-a1.txt").read_text()
    assert recorder.of("TrainingExited")[0]["reason"].startswith("hang:")
    assert store.get_node("j-1", "a1-r0").exit_code == ExitCode.UNHEALTHY


def test_hang_with_rollback_restarts_the_command(tmp_path: Path, imds: FakeImds) -> None:
    _, _, recorder, thread, result = run_agent(tmp_path, imds, mode="stall-once", steps=6, spec=_with_hang("rollback"))
    assert finish(thread, result) == ExitCode.DONE
    assert (tmp_path / "control" / "starts").read_text() == "xx"
    assert [a["health"]["action"] for a in recorder.of("Anomaly")] == ["rollback"]


def test_trainer_anomaly_is_published_by_node_rank0(tmp_path: Path, imds: FakeImds) -> None:
    _, _, recorder, thread, result = run_agent(tmp_path, imds, mode="anomaly", steps=5)
    assert finish(thread, result) == ExitCode.DONE
    [anomaly] = recorder.of("Anomaly")
    assert anomaly["what"] == "grad-explosion" and anomaly["health"]["value"] == 40.0


def test_training_output_is_shipped_off_the_node(tmp_path: Path, imds: FakeImds) -> None:
    shipped: list[tuple[str, int, int, str]] = []

    class Sink:
        def put(self, job_id: str, attempt: int, rank: int, lines: list[tuple[int, str]]) -> None:
            shipped.extend((job_id, attempt, rank, text) for _, text in lines)

    _, _, _, thread, result = run_agent(tmp_path, imds, steps=4, log_sink=Sink())
    assert finish(thread, result) == ExitCode.DONE
    assert [text for *_, text in shipped if text.startswith("step")] == ["step 1", "step 2", "step 3", "step 4"]
    assert {(j, a, r) for j, a, r, _ in shipped} == {("j-1", 1, 0)}
