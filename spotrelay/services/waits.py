"""The workflow's two task-token waits: "ready" (every node reported NodeReady) and "outcome"
(the attempt ended: training finished, an interruption, a node loss, a user error).

Whoever changes node state calls :func:`settle`: it decides whether the wait is over (pure
:func:`ready_verdict` / :func:`outcome_verdict`), classifies the end once with
``recovery.classify_nodes`` into an ``AttemptEnd`` (spotrelay/contracts/recovery.py) and, if a
token is waiting, claims it with a conditional write (removing it from the job) before completing
it. So a verdict is delivered once, whatever order the events, the token registration and their duplicates arrive in.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from spotrelay.contracts.exit_codes import ExitCode
from spotrelay.contracts.recovery import AttemptEnd, Verdict
from spotrelay.domain.models import Job, Node, NodeState
from spotrelay.domain.status import JobStatus, transition
from spotrelay.errors import ConflictError, InvalidTransitionError, JobCancelledError
from spotrelay.recovery.classify import classify_nodes
from spotrelay.services.controller import Controller, attempt_nodes, spec_of
from spotrelay.services.notify import announce, recovery_downtime

log = logging.getLogger(__name__)

READY = "ready"
OUTCOME = "outcome"
GONE = (NodeState.LOST, NodeState.TERMINATED, NodeState.EXITED)
# exit codes that let the other ranks finish on their own (anything else breaks their collectives)
_CLEAN = (ExitCode.DONE, ExitCode.CANCELLED, ExitCode.PREEMPTED_SAVED, ExitCode.PREEMPTED_UNSAVED)


def _classify(job: Job, nodes: list[Node]) -> AttemptEnd:
    try:
        return classify_nodes(nodes)
    except ValueError:  # gone with nothing reported (e.g. released before an exit code): a loss
        return AttemptEnd(outcome=Verdict.NODE_LOST, attempt=job.attempt, reason="nodes gone without an exit code",
                          lost_ranks=tuple(n.rank for n in nodes if n.state in GONE))


def _broken(node: Node) -> bool:
    """Gone without notice, or exited with a code that breaks its peers' collectives."""
    return node.state is NodeState.LOST or (
        node.state is NodeState.EXITED and node.exit_code is not None and int(node.exit_code) not in _CLEAN)


def ready_verdict(job: Job, nodes: list[Node]) -> AttemptEnd | None:
    """READY when every node of the attempt came up; how it ended when one went away first."""
    if not nodes:
        return None
    if all(n.state in GONE for n in nodes) or any(
            _broken(n) or n.state in (NodeState.DOOMED, NodeState.TERMINATED) for n in nodes):
        end = _classify(job, nodes)
        return end.model_copy(update={"reason": f"{end.reason} before training started"})
    if all(n.state in (NodeState.READY, NodeState.RUNNING, NodeState.EXITED) for n in nodes):
        return AttemptEnd(outcome=Verdict.READY, attempt=job.attempt)
    return None


def outcome_verdict(job: Job, nodes: list[Node]) -> AttemptEnd | None:
    """How the attempt ended (``classify_nodes``, the one classifier), or None while it runs.

    When it ends is decided here: an unannounced loss, a user error or an infrastructure error ends
    it at once (the other ranks would hang in a collective); after an interruption notice it ends
    when every rank is done, so the emergency checkpoint can finish; or, with the spec's
    ``recovery.launch_at_notice``, at once with the notice's ``deadline``: the ranks keep saving
    (they drain) while recover launches their replacements.
    """
    if not nodes:
        return None
    if any(_broken(n) for n in nodes) or all(n.state in GONE for n in nodes):
        return _classify(job, nodes)
    reclaims = [n.reclaim_at for n in nodes if n.state is NodeState.DOOMED and n.reclaim_at is not None]
    if reclaims and _launch_at_notice(job):
        end = _classify(job, nodes)  # interrupted: the doomed ranks are lost, the others still save
        return end.model_copy(update={"deadline": max(reclaims), "saved": None})
    return None


def _launch_at_notice(job: Job) -> bool:
    # a stored spec is the validated spec's full dump (services/submit.py): its flag is read as is,
    # not by validating the whole spec again at every node event; anything else is validated
    recovery = job.spec.get("recovery")
    flag = recovery.get("launch_at_notice") if isinstance(recovery, dict) else None
    return flag if isinstance(flag, bool) else spec_of(job).recovery.launch_at_notice


def settle(ctl: Controller, job_id: str, now: float) -> AttemptEnd | None:
    """Complete whichever wait has a verdict now; return the verdict delivered (None if none)."""
    job = ctl.store.find_job(job_id)
    if job is None or job.status.terminal or job.status is JobStatus.CANCELLING:
        return None
    if job.stop_save_by is not None:  # the ranks save for a stop (services/stop.py): their exits are its
        return None
    nodes = attempt_nodes(ctl.store, job)
    for wait, decide in ((READY, ready_verdict), (OUTCOME, outcome_verdict)):
        token = job.task_tokens.get(wait)
        if not token:
            continue
        verdict = decide(job, nodes)
        if verdict is None:
            continue
        claimed = deliver(ctl, job_id, wait, token, verdict, now)
        if claimed is None:
            continue  # another event delivered it first
        if verdict.outcome is Verdict.READY:
            downtime = recovery_downtime(claimed, now)
            if downtime is not None:
                ctl.measure("DowntimeSeconds", downtime)
            announce(ctl.notifier, "started" if claimed.attempt <= 1 else "recovered", claimed, now,
                     **({"downtime_s": downtime} if downtime is not None else {}))
        return verdict
    return None


def deliver(ctl: Controller, job_id: str, wait: str, token: str, verdict: AttemptEnd, now: float) -> Job | None:
    """Claim ``token`` (a conditional write removing it from the job), then complete it with the
    verdict. None when another event claimed it first."""
    def claim(cur: Job) -> Job | None:
        return _claim(cur, wait, token, verdict, now)

    claimed = ctl.store.update_job(job_id, claim)
    if claimed is None:
        return None
    try:
        ctl.need_workflow().send_success(token, verdict.model_dump(mode="json"))
    except ConflictError:
        log.info("wait already ended", extra={"job_id": job_id, "wait": wait})
    log.info("wait completed", extra={"job_id": job_id, "wait": wait, "verdict": verdict.outcome.value,
                                      "reason": verdict.reason, "lost_ranks": list(verdict.lost_ranks)})
    return claimed


def _claim(job: Job, wait: str, token: str, verdict: AttemptEnd, now: float) -> Job | None:
    if job.task_tokens.get(wait) != token:
        return None
    update: dict[str, Any] = {"task_tokens": {k: v for k, v in job.task_tokens.items() if k != wait},
                              "updated_at": now}
    # SUCCEEDED at the ready wait: every rank finished before its NodeReady was seen (dropped or
    # late); training did run, so the job passes RUNNING on its way to SUCCEEDED (property tests)
    if verdict.outcome in (Verdict.READY, Verdict.SUCCEEDED) and job.status is JobStatus.STARTING:
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
