"""The workflow's recover task: an attempt ended early. Classify how, charge the retry budget,
release what the spec's strategy drops, and tell the workflow how long to back off.

Order (spotrelay/recovery's stable API): classify_nodes -> check_retry_budget -> plan_recovery.
A spent budget raises RetryBudgetExhaustedError; the workflow's FailJob branch tears down and
records FAILED with that message.
"""

from __future__ import annotations

import logging
from typing import Any

from spotrelay.contracts.workflow import WorkflowTimings
from spotrelay.domain.models import Job, Node, NodeState
from spotrelay.domain.status import JobStatus, transition
from spotrelay.errors import JobCancelledError, NoPlacementError
from spotrelay.placement import PoolEvent
from spotrelay.recovery import AttemptEnd, Outcome, RecoveryContext, check_retry_budget, classify_nodes, plan_recovery
from spotrelay.services.controller import Controller, attempt_nodes, release_nodes, spec_of
from spotrelay.services.notify import announce
from spotrelay.services.workflow_tasks import _close_attempt

log = logging.getLogger(__name__)
_DEAD = (NodeState.DOOMED, NodeState.LOST, NodeState.TERMINATED)
_TIMEOUTS = ("ready-timeout", "heartbeat-timeout")


def backoff_seconds(timings: WorkflowTimings, retries: int) -> int:
    """Exponential: backoff_s, 2x, 4x ... capped at backoff_max_s (retries counts from 1)."""
    if timings.backoff_s <= 0:
        return 0
    return int(min(timings.backoff_s * 2 ** max(0, retries - 1), max(timings.backoff_max_s, timings.backoff_s)))


def _mark_unresponsive(ctl: Controller, job: Job, nodes: list[Node], verdict: str, timings: WorkflowTimings,
                       now: float) -> list[Node]:
    """A timed-out wait means some nodes never answered: call them lost so the strategy replaces them."""
    if verdict == "ready-timeout":
        suspects = [n for n in nodes if n.state is NodeState.PENDING]
    else:
        stale = now - timings.heartbeat_s
        live = [n for n in nodes if n.state not in (*_DEAD, NodeState.EXITED)]
        suspects = [n for n in live if (n.last_heartbeat or n.launched_at) < stale] or live
    lost = {n.node_id for n in suspects}
    for node in suspects:
        ctl.store.update_node(job.job_id, node.node_id, lambda n: n.model_copy(update={"state": NodeState.LOST})
                              if n.state not in _DEAD else None)
    return [n.model_copy(update={"state": NodeState.LOST}) if n.node_id in lost else n for n in nodes]


def _mark_vanished(ctl: Controller, job: Job, nodes: list[Node]) -> list[Node]:
    """A rank's crash is often the echo of a peer that vanished (its collective broke) before the
    state-change event arrived: ask EC2 which instances still live, so the loss is classified as
    a loss and does not spend the user's restart budget."""
    regions = sorted({n.pool.region for n in nodes})
    alive = {i.instance_id for i in ctl.need_compute().list_tagged(regions) if i.job_id in (None, job.job_id)}
    vanished = {n.node_id for n in nodes if n.instance_id not in alive and n.state not in _DEAD}
    for node_id in vanished:
        ctl.store.update_node(job.job_id, node_id, lambda n: n.model_copy(update={"state": NodeState.LOST})
                              if n.state not in _DEAD else None)
    return [n.model_copy(update={"state": NodeState.LOST}) if n.node_id in vanished else n for n in nodes]


def _classify(nodes: list[Node], verdict: dict[str, Any]) -> Outcome:
    try:
        return classify_nodes(nodes)
    except ValueError:  # nothing in the records explains it (e.g. a lost wait): treat the gang as lost
        return Outcome(kind=AttemptEnd.NODE_LOST, reason=str(verdict.get("detail") or verdict.get("outcome")),
                       lost_ranks=tuple(n.rank for n in nodes))


def recover(ctl: Controller, job_id: str, verdict: dict[str, Any], timings: WorkflowTimings,
            now: float) -> dict[str, Any]:
    job = ctl.store.get_job(job_id)
    if job.status is JobStatus.CANCELLING:
        raise JobCancelledError(f"job {job_id} is being cancelled")
    nodes = attempt_nodes(ctl.store, job)
    if job.status is JobStatus.RECOVERING:  # a retried task: the work is done, answer the same
        return _result(job, nodes, timings, str(verdict.get("outcome")), "")
    if verdict.get("outcome") in _TIMEOUTS:
        nodes = _mark_unresponsive(ctl, job, nodes, str(verdict["outcome"]), timings, now)
    elif verdict.get("outcome") in ("user-error", "infra-error"):
        nodes = _mark_vanished(ctl, job, nodes)
    outcome = _classify(nodes, verdict)
    if outcome.kind is AttemptEnd.CANCELLED:
        raise JobCancelledError(f"job {job_id}: {outcome.reason}")
    spec = spec_of(job)
    decision = check_retry_budget(spec.recovery, outcome, job.recoveries, job.user_restarts)  # may raise

    current = job.attempts[-1] if job.attempts else None
    if current is not None and current.pool is not None and current.started_at is not None:
        hours = max(0.0, now - current.started_at) / 3600.0 * max(1, current.nodes)
        ctl.pool_stats.record(current.pool.key, PoolEvent.OBSERVED, now, hours=hours)
    keep: list[str] = []
    action, reason = "new-cluster", outcome.reason
    try:
        assert ctl.market is not None
        res = spec.resources
        quotes = ctl.market.quotes(res.regions, res.instance_types, [m.value for m in res.markets])
        stats = ctl.pool_stats.get_many([q.pool.key for q in quotes])
        plan = plan_recovery(RecoveryContext(spec=spec, outcome=outcome, nodes=nodes, quotes=quotes, stats=stats,
                                             now=now, excluded=frozenset(job.excluded_pools)))
        keep, action, reason = list(plan.keep_instance_ids), plan.action, plan.reason
    except NoPlacementError as exc:  # every pool cools down right now; Plan decides after the backoff
        log.info("no pool to recover into yet", extra={"job_id": job_id, "why": str(exc)})
    if outcome.kind is AttemptEnd.USER_ERROR and action != "new-cluster":
        keep = []  # a user restart relaunches in place only through a new gang (simple and clean)
        action = "new-cluster"
    release_nodes(ctl, job, [n for n in nodes if n.instance_id not in keep])

    excluded = set(job.excluded_pools)
    if action == "new-cluster" and current is not None and current.pool is not None and outcome.kind in (
            AttemptEnd.INTERRUPTED, AttemptEnd.NODE_LOST, AttemptEnd.INFRA_ERROR):
        excluded.add(current.pool.key)  # plan again without the pool that just failed
    ckpt_step = job.last_checkpoint.step if job.last_checkpoint else 0

    def to_recovering(cur: Job) -> Job | None:
        if cur.status is JobStatus.RECOVERING:
            return None
        update: dict[str, Any] = {
            "status": transition(cur.status, JobStatus.RECOVERING), "updated_at": now, "task_tokens": {},
            "recoveries": decision.recoveries, "user_restarts": decision.user_restarts,
            "steps_lost": cur.steps_lost + max(0, cur.last_step - ckpt_step),
            "excluded_pools": sorted(excluded),
        }
        update.update(_close_attempt(cur, now, outcome.kind.value))
        return cur.model_copy(update=update)

    job = ctl.store.update_job(job_id, to_recovering) or ctl.store.get_job(job_id)
    result = _result(job, attempt_nodes(ctl.store, job), timings, outcome.kind.value, reason)
    announce(ctl.notifier, "interrupted", job, now, reason=outcome.reason, action=action,
             backoff_s=result["backoff_s"], retry=decision.reason)
    log.info("recovering", extra={"job_id": job_id, **result})
    return result


def _result(job: Job, nodes: list[Node], timings: WorkflowTimings, outcome: str, reason: str) -> dict[str, Any]:
    keep = [n for n in nodes if n.state not in _DEAD]  # exited ranks' instances still run
    current = job.attempts[-1] if job.attempts else None
    ranks = sorted({n.rank for n in keep})
    size = int(job.spec.get("resources", {}).get("nodes", len(nodes)))
    return {
        "backoff_s": backoff_seconds(timings, job.recoveries + job.user_restarts),
        "outcome": outcome,
        "reason": reason,
        "recoveries": job.recoveries,
        "user_restarts": job.user_restarts,
        "keep_instance_ids": [n.instance_id for n in keep],
        "launch_ranks": [r for r in range(size) if r not in ranks],
        "pool": current.pool.key if keep and current and current.pool else None,
    }
