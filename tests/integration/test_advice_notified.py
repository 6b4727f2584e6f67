"""The interruption message tells people what ``spotrelay describe`` advises (domain/advice.py): a fixed
gang whose last spot gangs spent a fifth or more of their time booting and restoring gets the line with
its figures, on the message and in Slack; a gang that lives long gets none."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from functions import sfn_recover
from spotrelay.domain.models import Attempt, Node, NodeState
from spotrelay.services.notify import slack_payload
from tests.integration.controller_doubles import Env, ctx, env, replaced, running_job
from tests.unit.test_services_notify import Recorder

__all__ = ["env"]
TIMINGS = {"backoff_s": 5, "backoff_max_s": 60}


@pytest.fixture
def told(env: Env) -> Iterator[Recorder]:
    recording = Recorder()
    with replaced(notifier=lambda: recording):
        yield recording


def sixth_gang_lost(env: Env, up_s: float, life_s: float) -> str:
    """A 2-node fixed gang on attempt 6 (launched ``life_s`` ago, trained ``up_s`` after its launch),
    after five like it that a notice ended; rank 1 is then lost and sfn_recover closes attempt 6."""
    job, gang = running_job(env.store, env.compute)
    now = time.time()
    history = [Attempt(number=i + 1, pool=gang[0].pool, started_at=now - (6 - i) * (life_s + 60.0),
                       resumed_at=now - (6 - i) * (life_s + 60.0) + up_s,
                       ended_at=now - (6 - i) * (life_s + 60.0) + life_s, end_reason="interrupted", nodes=2)
               for i in range(5)]
    current = job.attempts[0].model_copy(update={"number": 6, "started_at": now - life_s,
                                                 "resumed_at": now - life_s + up_s})
    env.store.update_job(job.job_id, lambda j: j.model_copy(update={
        "attempt": 6, "attempts": [*history, current],
        "spec": {**j.spec, "resources": {**j.spec["resources"], "min_nodes": None}}}))
    for node in gang:  # the gang is attempt 6's
        env.store.update_node(job.job_id, node.node_id, lambda n: n.model_copy(update={"state": NodeState.TERMINATED}))
        env.store.put_node(Node(**{**node.model_dump(), "node_id": f"a6-r{node.rank}", "attempt": 6,
                                   "state": NodeState.LOST if node.rank == 1 else NodeState.RUNNING}))
    sfn_recover.handler({"job_id": job.job_id, "timings": TIMINGS,
                         "outcome": {"outcome": "node-lost", "attempt": 6}}, ctx())
    return job.job_id


def test_a_fixed_gang_restarting_every_26_minutes_is_told_on_the_interruption_message(
        env: Env, told: Recorder) -> None:
    job_id = sixth_gang_lost(env, up_s=450.0, life_s=1560.0)
    assert env.store.get_job(job_id).attempts[-1].end_reason == "node-lost"
    interrupted = [(subject, context) for kind, _, subject, context, _ in told.sent if kind == "interrupted"]
    assert len(interrupted) == 1
    subject, context = interrupted[0]
    assert context["advice"].startswith(
        "the last 6 spot gangs of 2 nodes spent 29% of their time booting and restoring")
    message = {"kind": "interrupted", "job_id": job_id, "subject": subject, "context": context}
    slack = " ".join(b["text"]["text"] for b in slack_payload(message)["blocks"] if "text" in b)
    assert "*Advice:* the last 6 spot gangs of 2 nodes" in slack and "resources.min_nodes" in slack


def test_gangs_that_live_for_hours_get_no_advice(env: Env, told: Recorder) -> None:
    sixth_gang_lost(env, up_s=450.0, life_s=6 * 3600.0)
    interrupted = [context for kind, _, _, context, _ in told.sent if kind == "interrupted"]
    assert len(interrupted) == 1 and "advice" not in interrupted[0]
