"""The job-run workflow goes on in a new execution before its history fills.

Step Functions ends a standard execution at 25,000 history events, and a job's workflow loops for as
long as the job trains: a 30-minute review poll writes ~22 events, a recovery ~50, a rebalance's
prewarm ~17, so a job would have its execution ended under it after about three weeks of calm or a week
of storms (the reconcile sweep then fails the job). The ASL counts its passes through Plan, Review and
Prewarm (``$.hops``, ``States.MathAdd``); at ``timings.max_hops`` it calls this task instead
(HandOverPlan / HandOverReview / HandOverWait), which starts the job's next execution with the same
data, resuming at the same state (the ASL's ``Entry`` choice), and points the job record at it; the old
execution then succeeds (``HandedOver``). At each point no task token is open (the outcome wait has just
timed out, or ended with a rebalance the prewarm has served; Plan has not registered one), so nothing
the agents send is lost: the next wait registers its token as the first one does, and settles at once
on what the nodes reported meanwhile.
"""

from __future__ import annotations

import logging
from contextlib import suppress
from typing import Any

from spotrelay.errors import PermanentError
from spotrelay.services.controller import Controller

log = logging.getLogger(__name__)


def _hops(data: dict[str, Any]) -> tuple[int, int]:
    """(this execution's passes, its generation: 0 for the job's first execution) from ``$.hops``."""
    hops = data.get("hops")
    if not isinstance(hops, dict):
        return 0, 0
    return int(hops.get("count", 0)), int(hops.get("generation", 0))


def next_input(data: dict[str, Any], resume_at: str) -> tuple[dict[str, Any], int]:
    """(the next execution's input: ``data`` resuming at ``resume_at`` with its passes counted from 0;
    its generation, 1 for the job's first hand-over)."""
    generation = _hops(data)[1] + 1
    payload = {k: v for k, v in data.items() if k not in ("handover", "error")}
    payload.update(resume_at=resume_at, hops={"count": 0, "generation": generation})
    return payload, generation


def execution_name(job_id: str, data: dict[str, Any]) -> str:
    """``<job_id>-h<generation>-<pass>``: the task's retries start (and find) the same execution; a later
    try, after one that failed, another name (Step Functions keeps a closed execution's name)."""
    count, generation = _hops(data)
    return f"{job_id}-h{generation + 1}-{count}"


def hand_over(ctl: Controller, job_id: str, resume_at: str, data: dict[str, Any], now: float) -> dict[str, Any]:
    """Start the job's next execution (``execution_name``) and record it as the job's; returns its ARN and
    generation. If the record cannot be written, the new execution is stopped and this one goes on
    (the ASL's catch): one execution drives a job at a time."""
    payload, generation = next_input(data, resume_at)
    workflow = ctl.need_workflow()
    arn = workflow.start(job_id, payload, name=execution_name(job_id, data))
    try:
        ctl.store.update_job(job_id, lambda j: None if j.execution_arn == arn else j.model_copy(
            update={"execution_arn": arn, "updated_at": now}))
    except Exception as exc:
        with suppress(Exception):
            workflow.stop(arn, "the hand-over could not be recorded on the job; the last execution goes on")
        raise PermanentError(f"hand-over of {job_id} not recorded: {exc}") from exc
    log.info("workflow handed over", extra={"job_id": job_id, "execution_arn": arn, "resume_at": resume_at})
    return {"execution_arn": arn, "generation": generation}
