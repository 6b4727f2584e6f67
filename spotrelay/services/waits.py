"""The workflow's two task-token waits: "ready" (every node reported NodeReady) and "outcome"
(the attempt ended: training finished, an interruption, a node loss, a user error).

Whoever changes node state calls :func:`settle`: it derives the verdict from the node records
(pure :func:`ready_verdict` / :func:`outcome_verdict`) and, if a token is waiting, claims it with a
conditional write (removing it from the job) before completing it. So a verdict is delivered once,
whatever order the events, the token registration and their duplicates arrive in.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from spotrelay.contracts.exit_codes import ExitCode
from spotrelay.domain.models import Job, Node, NodeState
from spotrelay.domain.status import JobStatus, transition
from spotrelay.errors import ConflictError, InvalidTransitionError, JobCancelledError
from spotrelay.services.controller import Controller, attempt_nodes
from spotrelay.services.notify import announce

log = logging.getLogger(__name__)

READY = "ready"
OUTCOME = "outcome"
GONE = (NodeState.LOST, NodeState.TERMINATED, NodeState.EXITED)
PREEMPTED = (ExitCode.PREEMPTED_SAVED, ExitCode.PREEMPTED_UNSAVED)


def _verdict(outcome: str, job: Job, detail: str = "", **extra: Any) -> dict[str, Any]:
    return {"outcome": outcome, "attempt": job.attempt, "detail": detail, **extra}


def ready_verdict(job: Job, nodes: list[Node]) -> dict[str, Any] | None:
    """"ready" when every node of the attempt is up; a failure verdict when one went away first."""
    if not nodes:
        return None
    doomed = [n.rank for n in nodes if n.state is NodeState.DOOMED]
    if doomed:
        return _verdict("interrupted", job, "spot interruption before training started", ranks=doomed)
    gone = [n.rank for n in nodes if n.state in GONE]
    if gone:
        return _verdict("node-lost", job, "node lost before training started", ranks=gone)
    if all(n.state in (NodeState.READY, NodeState.RUNNING) for n in nodes):
        return _verdict("ready", job)
    return None


def outcome_verdict(job: Job, nodes: list[Node]) -> dict[str, Any] | None:
    """How the attempt ended, or None while it is still running.

    An unannounced loss, a user error or an infrastructure error ends it at once (the other ranks
    would hang in a collective). After an interruption notice it ends when every rank is done,
    so the emergency checkpoint can finish.
    """
    if not nodes:
        return None
    lost = [n.rank for n in nodes if n.state is NodeState.LOST]
    if lost:
        return _verdict("node-lost", job, "node lost without notice", ranks=lost)
    exited = [n for n in nodes if n.state is NodeState.EXITED and n.exit_code is not None]
    # User errors first, across all ranks: a crashing rank makes its peers' collectives fail, and
    # they report that as an infrastructure error (77), whichever rank number exits first.
    for node in exited:
        code = int(node.exit_code or 0)
        if code not in (ExitCode.DONE, ExitCode.CANCELLED, ExitCode.INFRA_ERROR, *PREEMPTED):
            return _verdict("user-error", job, f"rank {node.rank} exited {code} ({ExitCode.describe(code)})",
                            exit_code=code, rank=node.rank)
    for node in exited:
        if int(node.exit_code or 0) == ExitCode.INFRA_ERROR:
            return _verdict("infra-error", job, f"rank {node.rank} hit an infrastructure error",
                            exit_code=ExitCode.INFRA_ERROR)
    if not all(n.state in GONE for n in nodes):
        return None
    codes = {int(n.exit_code) for n in exited if n.exit_code is not None}
    if len(exited) == len(nodes) and codes == {ExitCode.DONE}:
        return _verdict("succeeded", job, "every rank exited 0")
    if ExitCode.CANCELLED in codes:
        return _verdict("cancelled", job, "training stopped on request")
    return _verdict("interrupted", job, "spot interruption; ranks checkpointed and stopped",
                    saved=ExitCode.PREEMPTED_UNSAVED not in codes)


def settle(ctl: Controller, job_id: str, now: float) -> dict[str, Any] | None:
    """Complete whichever wait has a verdict now; return the verdict delivered (None if none)."""
    job = ctl.store.find_job(job_id)
    if job is None or job.status.terminal or job.status is JobStatus.CANCELLING:
        return None
    nodes = attempt_nodes(ctl.store, job)
    for wait, decide in ((READY, ready_verdict), (OUTCOME, outcome_verdict)):
        token = job.task_tokens.get(wait)
        if not token:
            continue
        verdict = decide(job, nodes)
        if verdict is None:
            continue
        def claim(cur: Job, w: str = wait, t: str = token, v: dict[str, Any] = verdict) -> Job | None:
            return _claim(cur, w, t, v, now)

        claimed = ctl.store.update_job(job_id, claim)
        if claimed is None:
            continue  # another event delivered it first
        try:
            ctl.need_workflow().send_success(token, verdict)
        except ConflictError:
            log.info("wait already ended", extra={"job_id": job_id, "wait": wait})
        log.info("wait completed", extra={"job_id": job_id, "wait": wait, "verdict": verdict})
        if wait == READY and verdict["outcome"] == "ready":
            announce(ctl.notifier, "started" if claimed.attempt <= 1 else "recovered", claimed, now)
        return verdict
    return None


def _claim(job: Job, wait: str, token: str, verdict: dict[str, Any], now: float) -> Job | None:
    if job.task_tokens.get(wait) != token:
        return None
    update: dict[str, Any] = {"task_tokens": {k: v for k, v in job.task_tokens.items() if k != wait},
                              "updated_at": now}
    if wait == READY and verdict["outcome"] == "ready" and job.status is JobStatus.STARTING:
        update["status"] = transition(job.status, JobStatus.RUNNING)
    return job.model_copy(update=update)


def register_wait(ctl: Controller, job_id: str, wait: str, attempt: int, token: str, now: float) -> dict[str, Any]:
    """Keep the token on the job, then settle at once: the nodes may have reported already."""
    if wait not in (READY, OUTCOME):
        raise ValueError(f"unknown wait {wait!r}")

    def keep(job: Job) -> Job | None:
        if job.status.terminal or job.status is JobStatus.CANCELLING or job.attempt != attempt:
            return None
        return job.model_copy(update={"task_tokens": {**job.task_tokens, wait: token}, "updated_at": now})

    if ctl.store.update_job(job_id, keep) is None:
        job = ctl.store.get_job(job_id)
        why = f"job {job_id} is {job.status} (attempt {job.attempt}); not waiting for attempt {attempt}"
        error = (JobCancelledError if job.status is JobStatus.CANCELLING else InvalidTransitionError).__name__
        with contextlib.suppress(ConflictError):
            ctl.need_workflow().send_failure(token, error, why)
        return {"registered": False, "reason": why}
    verdict = settle(ctl, job_id, now)
    return {"registered": True, "wait": wait, "settled": verdict is not None}


def heartbeat(ctl: Controller, job: Job) -> bool:
    """Keep the outcome wait alive (its HeartbeatSeconds); False when nothing is waiting."""
    token = job.task_tokens.get(OUTCOME)
    if not token:
        return False
    try:
        ctl.need_workflow().send_heartbeat(token)
    except ConflictError:
        return False
    return True
