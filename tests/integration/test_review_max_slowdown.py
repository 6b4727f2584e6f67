"""recovery.max_slowdown through the review's handler: a gang on on-demand behind its schedule is not moved
back to spot (placement/spot_evidence.WallLimit), where the same job without the limit is; a spot gang
behind it is moved to on-demand (placement/review.catch_up)."""

from __future__ import annotations

import time
from typing import Any

from functions import sfn_review
from spotrelay.domain.models import Attempt, Job, NodeState
from tests.integration.controller_doubles import Env, ctx, env, pool, running_job

__all__ = ["env"]
H = 3600.0


def _behind(env: Env, job_id: str, limit: float | None, market: str = "on-demand", done_h: float = 1.0,
            submitted_h: float | None = None) -> str:
    """A 2-node job 10 h in: a spot gang of p5 nodes that committed ``done_h`` hours of training (2.8x that
    on the cheapest on-demand pool per unit of work, p4d), reclaimed, then the gang on ``market`` that trains
    now (at 1.5x, 6.7 h of such training were due; an hour of p5's is 2.8 h: 3.9 h behind);
    ``submitted_h``: the job was submitted that long ago (its record's created_at), not when its first gang
    started."""
    job, _ = running_job(env.store, env.compute, job_id=job_id, market=market)
    start = time.time() - 10 * H
    spot = Attempt(number=1, pool=pool(), started_at=start, ended_at=start + 2 * H, end_reason="interrupted",
                   nodes=2, world_size=2, cost=1.0, resumed_from_step=0, resumed_at=start + 600,
                   saved_step=round(100 * done_h), saved_at=start + 600 + done_h * H)
    now = job.attempts[0].model_copy(update={"number": 2, "started_at": start + 2.2 * H, "world_size": 2})
    created = job.created_at if submitted_h is None else time.time() - submitted_h * H

    def limited(j: Job) -> Job:
        spec: dict[str, Any] = dict(j.spec or {})
        spec["recovery"] = {**spec["recovery"], "max_slowdown": limit}
        return j.model_copy(update={"attempts": [spot, now], "attempt": 2, "spec": spec, "created_at": created})

    env.store.update_job(job_id, limited)
    for node in env.store.nodes_of(job_id):
        env.store.update_node(job_id, node.node_id,
                              lambda n: n.model_copy(update={"attempt": 2, "state": NodeState.RUNNING}))
    return job_id


def test_a_job_behind_its_schedule_stays_on_on_demand(env: Env) -> None:
    free = sfn_review.handler({"job_id": _behind(env, "free", None), "attempt": 2}, ctx())
    assert free["outcome"] == "migrate" and free["target"]["pool"]["market"] == "spot"  # spot is far cheaper
    bounded = sfn_review.handler({"job_id": _behind(env, "bounded", 1.5), "attempt": 2}, ctx())
    assert bounded["outcome"] == "ready"  # stays: behind its schedule


def test_a_spot_gang_behind_its_schedule_moves_to_on_demand(env: Env) -> None:
    free = sfn_review.handler({"job_id": _behind(env, "free", None, "spot"), "attempt": 2}, ctx())
    assert free["outcome"] == "ready"  # on the cheapest pool already: nothing better by cost
    bounded = sfn_review.handler({"job_id": _behind(env, "bounded", 1.5, "spot"), "attempt": 2}, ctx())
    assert bounded["outcome"] == "migrate" and bounded["target"]["pool"]["market"] == "on-demand"
    assert bounded["target"]["nodes"] == 2 and "behind the schedule of recovery.max_slowdown" in bounded["reason"]


def test_the_schedule_counts_the_wait_before_the_first_launch(env: Env) -> None:
    """5.9 h of on-demand's training (2.1 h of p5 spot's) 10 h after the first start is within the grace at
    1.5x (6.7 h due: 0.8 h behind); the same job submitted 3 h before that start had 8.7 h due (2.8 h
    behind): its spot gang moves to on-demand."""
    launched = sfn_review.handler({"job_id": _behind(env, "launched", 1.5, "spot", done_h=2.1), "attempt": 2}, ctx())
    assert launched["outcome"] == "ready"
    waited = sfn_review.handler({"job_id": _behind(env, "waited", 1.5, "spot", done_h=2.1, submitted_h=13.0),
                                 "attempt": 2}, ctx())
    assert waited["outcome"] == "migrate" and waited["target"]["pool"]["market"] == "on-demand"
