"""The agent's loop end to end on one node, fast: a fake IMDS, a temporary directory, the agent's port
in process (its events go through the controller's real handler into an in-memory job store: the
node records checked here were written by the controller, never by the agent), and a stand-in
trainer (no torch) that honours the control contract like agent/training.py.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from agent.config import AgentConfig
from agent.daemon import Agent
from agent.imds import ImdsClient
from agent.launcher import Rendezvous
from agent.reporting import Reporter
from spotrelay.adapters.memory_job_store import MemoryJobStore
from spotrelay.contracts.events import AgentEventModel, Directive, DirectiveKind
from spotrelay.contracts.exit_codes import ExitCode
from spotrelay.domain.models import Job, NodeState
from spotrelay.domain.status import JobStatus
from spotrelay.local.fake_imds import FakeImds
from spotrelay.spec.models import JobSpec
from tests.agent_port import InProcessAgentPort
from tests.unit.agent_harness import HANG_S, SPEC, finish, imds, rank0_node, release, run_agent, wait_for

__all__ = ["imds"]  # the fixture, imported for pytest


def test_runs_to_done_with_registration_and_heartbeats(tmp_path: Path, imds: FakeImds) -> None:
    # held at its last step until a heartbeat with a step went out: a 1.2 s run could end before a
    # starved agent thread's first beat (heartbeats go out only while the trainer runs)
    _, store, recorder, thread, result = run_agent(tmp_path, imds, steps=12, hold=1)
    wait_for(lambda: any((h["step"] or 0) >= 1 for h in recorder.of("Heartbeat")))
    release(tmp_path)
    assert finish(thread, result) == ExitCode.DONE
    assert recorder.kinds()[0] == "NodeReady" and recorder.kinds()[-1] == "TrainingExited"
    assert recorder.of("Heartbeat") and recorder.of("Heartbeat")[-1]["step"] >= 1
    node = store.get_node("j-1", "a1-r0")
    assert node.state is NodeState.EXITED and node.exit_code == 0 and node.private_ip == "127.0.0.1"
    assert node.last_heartbeat is not None


def test_interruption_notice_saves_and_exits_75(tmp_path: Path, imds: FakeImds) -> None:
    _, store, recorder, thread, result = run_agent(tmp_path, imds, hold=1)
    wait_for(lambda: bool(recorder.of("Heartbeat")))
    deadline = float(int(time.time()) + 100)
    imds.set_interruption("terminate", deadline)
    assert finish(thread, result) == ExitCode.PREEMPTED_SAVED
    [commit] = recorder.of("CheckpointCommitted")
    assert commit["emergency"] and commit["met_deadline"] and commit["deadline"] == deadline
    assert recorder.of("TrainingExited")[0]["last_committed_step"] == commit["step"]
    assert store.get_node("j-1", "a1-r0").exit_code == 75


def test_rebalance_checkpoints_and_training_continues(tmp_path: Path, imds: FakeImds) -> None:
    _, _, recorder, thread, result = run_agent(tmp_path, imds, steps=25, hold=1)
    wait_for(lambda: bool(recorder.of("Heartbeat")))
    imds.set_rebalance()
    wait_for(lambda: bool(recorder.of("CheckpointCommitted")))
    assert finish(thread, result) == ExitCode.DONE
    [commit] = recorder.of("CheckpointCommitted")  # once, though IMDS kept showing the recommendation
    assert not commit["emergency"]
    assert not (tmp_path / "control" / "request.json").exists()


def test_stop_directive_cancels_and_is_cleared(tmp_path: Path, imds: FakeImds) -> None:
    _, store, recorder, thread, result = run_agent(tmp_path, imds, hold=1)
    wait_for(lambda: bool(recorder.of("Heartbeat")))
    directive = Directive(directive_id="d-stop-1", kind=DirectiveKind.STOP, issued_at=time.time(), reason="cancel")
    store.update_node("j-1", "a1-r0", lambda n: n.model_copy(update={"directive": directive.model_dump()}))
    assert finish(thread, result) == ExitCode.CANCELLED
    assert store.get_node("j-1", "a1-r0").directive is None


def test_deadline_missed_kills_and_reports_unsaved(tmp_path: Path, imds: FakeImds) -> None:
    _, _, recorder, thread, result = run_agent(tmp_path, imds, mode="hang", hold=1)
    wait_for(lambda: bool(recorder.of("Heartbeat")))
    imds.set_interruption("terminate", time.time() + 1.5)
    assert finish(thread, result) == ExitCode.PREEMPTED_UNSAVED
    [missed] = [a for a in recorder.of("Anomaly") if a["what"] == "deadline-missed"]
    assert "durable: nothing from this attempt" in missed["detail"]


def test_imds_down_is_reported_once_and_training_goes_on(tmp_path: Path, imds: FakeImds) -> None:
    # held at its last step until IMDS is back: a 3 s run could end before a starved agent thread
    # polled the dead IMDS twice, and the wait for the anomaly would then hang
    _, _, recorder, thread, result = run_agent(tmp_path, imds, steps=30, hold=1, imds_failures_anomaly=2)
    wait_for(lambda: bool(recorder.of("Heartbeat")))
    imds.set_up(False)
    wait_for(lambda: bool(recorder.of("Anomaly")))
    imds.set_up(True)
    release(tmp_path)
    assert finish(thread, result) == ExitCode.DONE
    assert [a["what"] for a in recorder.of("Anomaly")] == ["imds-unreachable"]


def test_sigterm_to_the_agent_saves_first(tmp_path: Path, imds: FakeImds) -> None:
    import signal

    agent, _, recorder, thread, result = run_agent(tmp_path, imds, hold=1)
    wait_for(lambda: bool(recorder.of("Heartbeat")))
    agent.on_signal(signal.SIGTERM, None)
    assert finish(thread, result) == ExitCode.PREEMPTED_SAVED
    assert recorder.of("CheckpointCommitted")[0]["emergency"]


def test_restart_directive_relaunches_the_command(tmp_path: Path, imds: FakeImds) -> None:
    _, store, _, thread, result = run_agent(tmp_path, imds, steps=20, hold=1)
    wait_for(lambda: (tmp_path / "control" / "starts").exists())  # the first run is under way
    directive = Directive(directive_id="d-restart-1", kind=DirectiveKind.RESTART, issued_at=time.time())
    store.update_node("j-1", "a1-r0", lambda n: n.model_copy(update={"directive": directive.model_dump()}))
    assert finish(thread, result) == ExitCode.DONE
    assert (tmp_path / "control" / "starts").read_text() == "xx"
    assert store.get_node("j-1", "a1-r0").directive is None


def test_survivor_joins_the_next_gang(tmp_path: Path, imds: FakeImds) -> None:
    _, store, recorder, thread, result = run_agent(tmp_path, imds, steps=20, hold=1, linger_s=20)
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
    _, store, recorder, thread, result = run_agent(tmp_path, imds, steps=40, hold=2, linger_s=60,
                                                   launches=launches, nodes=2)
    wait_for(lambda: bool(recorder.of("Heartbeat")))
    _stop_and_carry(store, recorder, "a1-r0", attempt=2, rank=0, nodes=1)
    wait_for(lambda: len(launches) == 2 and bool(store.get_node("j-1", "a2-r0").state is NodeState.RUNNING))
    _stop_and_carry(store, recorder, "a2-r0", attempt=3, rank=0, nodes=2)
    assert finish(thread, result) == ExitCode.DONE
    assert [(r.nodes, r.node_rank) for r in launches] == [(2, 0), (1, 0), (2, 0)]
    assert [e["attempt"] for e in recorder.of("NodeReady")] == [1, 2, 3]
    assert store.get_node("j-1", "a3-r0").directive is None


def test_agent_never_undoes_the_controllers_verdict(tmp_path: Path, imds: FakeImds) -> None:
    _, store, recorder, thread, result = run_agent(tmp_path, imds, hold=1)
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
    port.store.put_node(rank0_node(instance_id="i-0", state=NodeState.READY, private_ip="10.0.0.7",
                                    master_port=29611))
    agent = Agent(config, port, Reporter(config, port), ImdsClient(imds.url), sleep=lambda s: None)
    assert agent.wait_for_rank0() == ("10.0.0.7", 29611)  # rank 0's published port, not ours (29500)
    port.store.update_node("j-1", "a1-r0", lambda n: n.model_copy(update={"state": NodeState.LOST}))
    agent.on_signal(signal.SIGTERM, None)
    with pytest.raises(SpotrelayError, match="signal"):
        agent.wait_for_rank0()


def test_mlflow_run_created_after_ready_and_handed_to_the_trainer(tmp_path: Path, mlflow_uri: str,
                                                                  imds: FakeImds,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow.tracking import MlflowClient

    uri = mlflow_uri
    spec = SPEC.model_copy(update={"tracking": SPEC.tracking.model_copy(update={"tracking_uri": uri})})
    tracked_at_exit: list[list[float]] = []  # the exit code MLflow had when the controller heard the exit
    report = InProcessAgentPort.report

    def reporting(port: InProcessAgentPort, event: AgentEventModel) -> None:
        if event.kind == "TrainingExited":  # the controller may terminate the instance from here on
            run = port.store.get_job("j-1").mlflow_run_id
            tracked_at_exit.append([m.value for m in MlflowClient(tracking_uri=uri).get_metric_history(
                run, "exit_code")] if run else [])
        report(port, event)

    monkeypatch.setattr(InProcessAgentPort, "report", reporting)
    # (a bound that only catches a hang: a slow machine's MLflow calls must not look like a hung server)
    _, store, recorder, thread, result = run_agent(tmp_path, imds, steps=8, spec=spec, track_end_s=HANG_S)
    assert finish(thread, result) == ExitCode.DONE
    run_id = store.get_job("j-1").mlflow_run_id  # recorded by the controller from TrackingStarted
    assert [e["mlflow_run_id"] for e in recorder.of("TrackingStarted")] == [run_id]
    assert run_id and (tmp_path / "control" / "run_id").read_text() == run_id
    assert recorder.kinds()[0] == "NodeReady"
    history = MlflowClient(tracking_uri=uri).get_metric_history(run_id, "exit_code")
    assert [m.value for m in history] == [0]
    assert tracked_at_exit == [[0]]  # the attempt's end was recorded before the exit was reported
    assert MlflowClient(tracking_uri=uri).get_run(run_id).info.status == "FINISHED"


def _with_hang(action: str) -> JobSpec:
    # the stand-in trainer steps every 0.1 s: the limit must stay far above any stall a loaded machine gives
    # a running trainer between two steps (1 s could fire before the stuck step 3), and it only adds its own
    # length to these tests
    health = {"hang_after_s": 5.0, "actions": {"hang": action}}
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


def test_checkpoints_unreadable_now_end_the_attempt_as_infra_error(tmp_path: Path, imds: FakeImds) -> None:
    """The script dies of CheckpointUnavailableError (exit 1, a user error by its code); its ``unavailable``
    event makes it INFRA_ERROR with the message, so the controller retries instead of failing the job,
    and the trainer never started over from step 0 beside the checkpoints."""
    _, store, recorder, thread, result = run_agent(tmp_path, imds, mode="unavailable")
    assert finish(thread, result) == ExitCode.INFRA_ERROR
    [exited] = recorder.of("TrainingExited")
    assert exited["exit_code"] == ExitCode.INFRA_ERROR
    assert exited["reason"].startswith("infra-error: no checkpoint could be read now")
    node = store.get_node("j-1", "a1-r0")
    assert node.exit_code == ExitCode.INFRA_ERROR and node.output_tail is not None
    assert "step-00000004 unusable: s3: download failed" in node.output_tail


def test_a_refused_checkpoint_is_reported_as_refused_with_the_message(tmp_path: Path, imds: FakeImds) -> None:
    """The script dies of the refusal (traceback, exit 1); its ``refused`` event makes it exit 80 with the
    message as the output tail, so the controller fails the job once instead of retrying a user error."""
    _, store, recorder, thread, result = run_agent(tmp_path, imds, mode="refuse")
    assert finish(thread, result) == ExitCode.REFUSED
    [exited] = recorder.of("TrainingExited")
    assert exited["exit_code"] == ExitCode.REFUSED and exited["reason"].startswith("refused: /ckpt/step-00000004")
    node = store.get_node("j-1", "a1-r0")
    assert node.exit_code == ExitCode.REFUSED and node.output_tail is not None
    assert node.output_tail.startswith("/ckpt/step-00000004: written by a DeepSpeed session")
    assert (tmp_path / "control" / "starts").read_text() == "x"  # not relaunched on the node either
