"""The stop request poller: reads the agent's file, ignores requests already acted on."""

from __future__ import annotations

from pathlib import Path

from agent.stop import RequestPoller, agree
from spotrelay.contracts.control import RequestKind, StopRequest, write_request


def test_poller_sees_a_new_request_and_ignores_handled_ones(tmp_path: Path) -> None:
    poller = RequestPoller(tmp_path)
    assert poller.poll() is None
    write_request(tmp_path, StopRequest(request_id="r1", kind=RequestKind.CHECKPOINT, deadline=100.0))
    seen = poller.poll()
    assert seen is not None and seen.request_id == "r1"
    poller.handled.add("r1")
    assert poller.poll() is None
    write_request(tmp_path, StopRequest(request_id="r2", kind=RequestKind.CHECKPOINT_AND_STOP))
    seen = poller.poll()
    assert seen is not None and seen.kind is RequestKind.CHECKPOINT_AND_STOP


def test_agree_without_distributed_uses_the_local_view() -> None:
    request = StopRequest(request_id="r", kind=RequestKind.CHECKPOINT_AND_STOP, deadline=1234.5)
    decision = agree(request, due=False)
    assert decision.kind is RequestKind.CHECKPOINT_AND_STOP and decision.deadline == 1234.5
    idle = agree(None, due=True)
    assert idle.kind is None and idle.checkpoint_due and idle.deadline is None
