"""One first event per Lambda handler: the real-format AWS sample from tests/events/ for the event
handlers, a minimal task input for the workflow's tasks. The runtime grant test and bench/coldstart.py
both run every handler on these, so the two always exercise the same inputs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

EVENTS_DIR = Path(__file__).resolve().parent / "events"
EVENT_SAMPLES = {
    "on_submission": "s3_object_created_submission.json",
    "on_agent_event": "agent_heartbeat.json",
    "on_instance_state": "ec2_instance_state_terminated.json",
    "on_interruption_notice": "ec2_spot_interruption_warning.json",
    "on_rebalance": "ec2_rebalance_recommendation.json",
    "reconcile": "scheduled_event.json",
    "slack_notifier": "sns_notification.json",
}
# the workflow's tasks in the order the state machine calls them
TASK_ORDER = ("sfn_plan", "sfn_provision", "sfn_register_wait", "sfn_review", "sfn_recover", "sfn_handover",
              "sfn_teardown", "sfn_finalize")


def task_input(handler: str, job_id: str) -> dict[str, Any]:
    """A workflow task's input for ``job_id`` (the job may not exist: the first AWS calls are made anyway)."""
    inputs: dict[str, dict[str, Any]] = {
        "sfn_provision": {"plan": {"candidates": [], "launch_ranks": []}},
        "sfn_register_wait": {"wait": "ready", "attempt": 1, "task_token": "token"},
        "sfn_recover": {"outcome": {"outcome": "node-lost", "attempt": 1}},
        "sfn_review": {"attempt": 1},
        "sfn_handover": {"resume_at": "plan", "data": {"job_id": job_id, "hops": {"count": 250}}},
        "sfn_finalize": {"result": "FAILED"},
    }
    return {"job_id": job_id, **inputs.get(handler, {})}


def first_event(handler: str, job_id: str) -> dict[str, Any]:
    """The event a handler is first invoked with: its AWS sample, else its task input."""
    if handler in EVENT_SAMPLES:
        data: dict[str, Any] = json.loads((EVENTS_DIR / EVENT_SAMPLES[handler]).read_text())
        return data
    return task_input(handler, job_id)
