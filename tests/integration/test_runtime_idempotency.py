"""functions/_runtime.once against moto's DynamoDB when two handlers run at the same time in one
process (the twin serves each queue from its own thread). Found by the chaos campaign: an EC2
state-change and an agent event handled together left one idempotency record IN_PROGRESS, so
every redelivery of that event failed (IdempotencyAlreadyInProgressError) until it was dropped."""

from __future__ import annotations

import threading
from typing import Any

from functions._runtime import once, reset

WAIT_S = 300.0  # only catches a hang


def test_two_handlers_at_once_each_complete_their_own_record(aws: dict[str, str]) -> None:
    reset()
    first_running, second_ran = threading.Event(), threading.Event()
    results: dict[str, Any] = {}

    def first() -> dict[str, Any]:
        first_running.set()
        assert second_ran.wait(WAIT_S)  # the other handler starts and ends while this one runs
        return {"handled": "first"}

    def second() -> dict[str, Any]:
        second_ran.set()
        return {"handled": "second"}

    def run_first() -> None:
        results["first"] = once("agent_event", {"event_id": "e-1"}, first)

    thread = threading.Thread(target=run_first)
    thread.start()
    assert first_running.wait(WAIT_S)
    results["second"] = once("instance_state", {"instance_id": "i-1", "state": "terminated"}, second)
    thread.join(WAIT_S)
    assert results == {"first": {"handled": "first"}, "second": {"handled": "second"}}

    # a redelivery of either event returns its first result (it used to raise "already in progress")
    def again() -> dict[str, Any]:
        raise AssertionError("a repeat ran the handler again")

    assert once("agent_event", {"event_id": "e-1"}, again) == {"handled": "first"}
    assert once("instance_state", {"instance_id": "i-1", "state": "terminated"}, again) == {"handled": "second"}
