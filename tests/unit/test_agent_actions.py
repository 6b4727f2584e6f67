"""Decide and act: notices -> requests in the control dir, commit reports, deadlines, exit codes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent.actions import Responder, classify_exit, decide
from agent.config import AgentConfig
from agent.monitors import Notice, NoticeKind
from agent.notice_store import NoticeStore, deadline_for
from agent.reporting import Reporter
from spotrelay.contracts import control
from spotrelay.contracts.control import RequestKind, StopRequest, TrainerEvent
from spotrelay.contracts.events import AGENT_SOURCE, AgentEventModel, CheckpointCommitted, parse_agent_event
from spotrelay.contracts.exit_codes import ExitCode


class Recorder:
    """The agent's port, reporting only (what this file checks is what the agent says)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, dict[str, Any]]] = []

    def report(self, event: AgentEventModel) -> None:
        self.sent.append((AGENT_SOURCE, event.kind, event.model_dump(mode="json")))


def _responder(tmp_path: Path, now: list[float]) -> tuple[Responder, Recorder]:
    config = AgentConfig(job_id="j-1", attempt=1, rank=1, nodes=2, instance_id="i-1")
    recorder = Recorder()
    return Responder(tmp_path, Reporter(config, recorder, clock=lambda: now[0]),  # type: ignore[arg-type]
                     clock=lambda: now[0]), recorder


def _itn(when: float) -> Notice:
    return Notice(NoticeKind.SPOT_INTERRUPTION, "imds", action="terminate", time=when)


def test_decide_maps_every_notice() -> None:
    assert decide(_itn(100.0)).request is RequestKind.CHECKPOINT_AND_STOP
    assert decide(Notice(NoticeKind.REBALANCE, "imds", action="rebalance")).request is RequestKind.CHECKPOINT
    for directive, want in (
        ("CHECKPOINT_NOW", RequestKind.CHECKPOINT_AND_STOP),
        ("STOP", RequestKind.STOP),
        ("CHECKPOINT", RequestKind.CHECKPOINT),
    ):
        assert decide(Notice(NoticeKind.DIRECTIVE, "directive", "d1", directive)).request is want
    restart = decide(Notice(NoticeKind.DIRECTIVE, "directive", "d2", "RESTART"))
    assert restart.restart and restart.request is None


def test_deadlines() -> None:
    assert deadline_for(_itn(1120.0), now=1000.0) == 1120.0
    assert deadline_for(Notice(NoticeKind.SPOT_INTERRUPTION, "imds", action="stop"), now=1000.0) == 1120.0
    assert deadline_for(_itn(990.0), now=1000.0) == 1000.0  # already due
    assert deadline_for(Notice(NoticeKind.REBALANCE, "imds"), now=1000.0) is None
    directive = Notice(NoticeKind.DIRECTIVE, "directive", "d1", "CHECKPOINT_NOW", deadline=1050.0)
    assert deadline_for(directive, now=1000.0) == 1050.0


def test_same_interruption_via_imds_and_directive_asks_once(tmp_path: Path) -> None:
    now = [1000.0]
    responder, _ = _responder(tmp_path, now)
    store = NoticeStore()
    imds = store.add(_itn(1120.0), now[0])
    assert imds is not None
    first = responder.ask(RequestKind.CHECKPOINT_AND_STOP, imds.deadline, "itn")
    directive = store.add(Notice(NoticeKind.DIRECTIVE, "directive", "d1", "CHECKPOINT_NOW", deadline=1110.0), now[0])
    assert directive is not None
    responder.apply(directive)
    on_disk = control.read_request(tmp_path)
    assert on_disk is not None and on_disk.request_id == first.request_id  # same request ...
    assert on_disk.deadline == 1110.0  # ... with the earlier deadline
    responder.ask(RequestKind.CHECKPOINT, None, "rebalance")  # weaker: ignored
    assert control.read_request(tmp_path) == on_disk
    stop = responder.ask(RequestKind.STOP, None, "cancel")  # stronger: replaces
    assert control.read_request(tmp_path) == stop


def test_commit_before_deadline_is_reported(tmp_path: Path) -> None:
    now = [1000.0]
    responder, recorder = _responder(tmp_path, now)
    request = responder.ask(RequestKind.CHECKPOINT_AND_STOP, 1120.0, "itn")
    now[0] = 1030.0
    responder.on_events(
        [
            TrainerEvent(
                kind="checkpoint_committed",
                step=7,
                uri="s3://b/c/step-7",
                duration_s=12.5,
                emergency=True,
                deadline=1120.0,
                request_id=request.request_id,
                time=1029.0,
            )
        ]
    )
    [(source, kind, detail)] = recorder.sent
    event = parse_agent_event(detail)
    assert source == "spotrelay.agent" and kind == "CheckpointCommitted"
    assert isinstance(event, CheckpointCommitted)
    assert event.step == 7 and event.met_deadline is True and event.emergency and event.duration_s == 12.5
    now[0] = 1200.0
    responder.check_deadline(now[0])
    assert len(recorder.sent) == 1  # committed in time: no anomaly
    assert classify_exit(1, {0: 75, 1: 75}, responder.pending, True, False)[0] == ExitCode.PREEMPTED_SAVED


def test_missed_deadline_says_what_is_durable(tmp_path: Path) -> None:
    now = [1000.0]
    responder, recorder = _responder(tmp_path, now)
    responder.on_events(
        [TrainerEvent(kind="checkpoint_committed", step=10, uri="s3://b/step-10", duration_s=50, time=999.0)]
    )
    responder.ask(RequestKind.CHECKPOINT_AND_STOP, 1030.0, "itn")  # 30 s left, last save took 50 s
    kinds = [(k, d.get("what")) for _, k, d in recorder.sent]
    assert kinds[-1] == ("Anomaly", "deadline-at-risk")
    now[0] = 1031.0
    responder.check_deadline(now[0])
    responder.check_deadline(now[0] + 1)  # once
    missed = [d for _, k, d in recorder.sent if d.get("what") == "deadline-missed"]
    assert len(missed) == 1 and "step 10 s3://b/step-10" in missed[0]["detail"]
    assert responder.kill_due(1031.0 + 31, grace_s=30)
    assert not responder.kill_due(1031.0, grace_s=30)


def test_rebalance_checkpoint_is_cleared_after_commit(tmp_path: Path) -> None:
    now = [1000.0]
    responder, _ = _responder(tmp_path, now)
    request = responder.ask(RequestKind.CHECKPOINT, None, "rebalance")
    assert control.read_request(tmp_path) == request
    responder.on_events(
        [TrainerEvent(kind="checkpoint_committed", step=3, uri="u", request_id=request.request_id, time=1001.0)]
    )
    assert control.read_request(tmp_path) is None and responder.pending is None
    assert not responder.kill_due(5000.0, grace_s=1)  # training goes on


def test_classify_exit() -> None:
    stop = StopRequest(request_id="r", kind=RequestKind.CHECKPOINT_AND_STOP, deadline=1.0)
    cancel = StopRequest(request_id="c", kind=RequestKind.STOP)
    assert classify_exit(0, {0: 0, 1: 0}, None, False, False)[0] == ExitCode.DONE
    assert classify_exit(1, {0: 75, 1: 75}, stop, True, False)[0] == ExitCode.PREEMPTED_SAVED
    assert classify_exit(1, {0: 76}, stop, False, False)[0] == ExitCode.PREEMPTED_UNSAVED
    assert classify_exit(1, {0: 75, 1: 3}, stop, True, False) == (3, "user-error: a rank exited 3")
    assert classify_exit(1, {0: 78}, cancel, False, False)[0] == ExitCode.CANCELLED
    assert classify_exit(1, {0: 80, 1: 77}, None, False, False)[0] == ExitCode.REFUSED  # a rank's own 80 stays
    # no rank recorded a code (killed under us)
    assert classify_exit(-9, {}, stop, True, True)[0] == ExitCode.PREEMPTED_SAVED
    assert classify_exit(-9, {}, stop, False, True)[0] == ExitCode.PREEMPTED_UNSAVED
    assert classify_exit(-15, {}, cancel, False, True)[0] == ExitCode.CANCELLED
    assert classify_exit(1, {}, None, False, False)[0] == ExitCode.INFRA_ERROR
    assert classify_exit(1, {0: 0, 1: 0}, None, False, False)[0] == ExitCode.INFRA_ERROR


def test_periodic_commit_after_a_notice_is_not_the_emergency_save(tmp_path: Path) -> None:
    now = [1000.0]
    responder, recorder = _responder(tmp_path, now)
    responder.ask(RequestKind.CHECKPOINT_AND_STOP, 1120.0, "itn")
    responder.on_events([TrainerEvent(kind="checkpoint_committed", step=4, uri="u4", time=1001.0)])
    event = parse_agent_event(recorder.sent[-1][2])
    assert isinstance(event, CheckpointCommitted) and not event.emergency and event.met_deadline is None
    assert not responder.committed_since_request
    responder.on_events(
        [TrainerEvent(kind="checkpoint_committed", step=5, uri="u5", emergency=True, deadline=1120.0, time=1002.0)]
    )
    assert responder.committed_since_request


def test_newest_commit_wins_when_uploads_finish_out_of_order(tmp_path: Path) -> None:
    now = [1000.0]
    responder, _ = _responder(tmp_path, now)
    responder.on_events(
        [
            TrainerEvent(kind="checkpoint_committed", step=5, uri="u5", emergency=True, time=1001.0),
            TrainerEvent(kind="checkpoint_committed", step=4, uri="u4", time=1002.0),
        ]
    )
    assert responder.last_committed is not None and responder.last_committed.step == 5
