"""The workflow's recover task: an attempt ended early. Take the ``AttemptEnd`` settle classified,
charge the retry budget, release what the spec's strategy drops, and return the ``RecoveryPlan``
(spotrelay/contracts/recovery.py) that plan and provision execute, with the backoff.

Order (spotrelay/recovery's stable API): check_retry_budget -> plan_recovery. Only a timed-out wait,
which no event settled, is classified here (classify_nodes), once.
A spent budget raises RetryBudgetExhaustedError; the workflow's FailJob branch tears down and
records FAILED with that message.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from spotrelay.contracts.recovery import AttemptEnd, Promotion, RecoveryAction, RecoveryPlan, Verdict
from spotrelay.contracts.workflow import WorkflowTimings
from spotrelay.domain.advice import job_advice
from spotrelay.domain.models import Attempt, Job, Node, NodeState, Pool
from spotrelay.domain.status import JobStatus, transition
from spotrelay.errors import JobCancelledError, NoPlacementError
from spotrelay.placement import PoolEvent
from spotrelay.placement.spot_evidence import last_chance
from spotrelay.recovery import RecoveryContext, check_retry_budget, classify_nodes, plan_recovery, stall
from spotrelay.recovery.spares import spare_takeovers
from spotrelay.services.controller import (
    SPARE_LIVE,
    Controller,
    attempt_nodes,
    price_in_effect,
    release_nodes,
    spare_nodes,
    spec_of,
)
from spotrelay.services.notify import announce
from spotrelay.services.prewarm import standby_cost
from spotrelay.services.workflow_tasks import _close_attempt
from spotrelay.spec.models import JobSpec

log = logging.getLogger(__name__)
_DEAD = (NodeState.DOOMED, NodeState.LOST, NodeState.TERMINATED)
_SAVING = (NodeState.READY, NodeState.RUNNING, NodeState.DOOMED)  # may still commit an emergency save
DRAIN_GRACE_S = 30.0  # after the reclaim time, a draining node is released whatever it says


def failure_streak(job: Job, timings: WorkflowTimings, now: float | None = None) -> int:
    """Recoveries since the last healthy stretch: the trailing attempts that ran shorter than
    ``timings.healthy_s`` (the one just closed included; with ``now``, an attempt still open counts as
    ending then). A long healthy run resets the backoff."""
    streak = 0
    for attempt in reversed(job.attempts):
        ended = attempt.ended_at if attempt.ended_at is not None else now
        if attempt.started_at is None or ended is None:
            continue
        if ended - attempt.started_at >= timings.healthy_s:
            break
        streak += 1
    return max(1, streak)


def recovery_backoff_s(job: Job, timings: WorkflowTimings, end: AttemptEnd, now: float | None = None) -> int:
    """How long the workflow waits after this recovery before its next launch: nothing after a notice
    (the replacements are wanted while the window lasts), else the failure streak's backoff (``now``:
    the ending attempt may still be open in ``job``). The strategy reads it too: survivors would idle
    through it."""
    return 0 if end.deadline is not None else backoff_seconds(timings, failure_streak(job, timings, now))


def _world_after(job: Job, fallback: int) -> int:
    """Ranks of the next attempt: the current attempt's (a shrunk gang recovers at its size; a
    review grows it back), else ``resources.nodes``."""
    current = job.attempts[-1].world_size if job.attempts else 0
    return current or int(job.spec.get("resources", {}).get("nodes", fallback))


def backoff_seconds(timings: WorkflowTimings, retries: int) -> int:
    """Exponential: backoff_s, 2x, 4x ... capped at backoff_max_s (retries counts from 1)."""
    if timings.backoff_s <= 0:
        return 0
    return int(min(timings.backoff_s * 2 ** max(0, retries - 1), max(timings.backoff_max_s, timings.backoff_s)))


def _mark_unresponsive(ctl: Controller, job: Job, nodes: list[Node], verdict: Verdict, timings: WorkflowTimings,
                       now: float) -> list[Node]:
    """A timed-out wait means some nodes never answered: call them lost so the strategy replaces them."""
    if verdict is Verdict.READY_TIMEOUT:
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


def _mark_vanished(ctl: Controller, job: Job, nodes: list[Node]) -> tuple[list[Node], list[int]]:
    """A rank's crash is often the echo of a peer that vanished (its collective broke) before the
    state-change event arrived: ask EC2 which instances still live, so the loss is classified as
    a loss and does not spend the user's restart budget."""
    regions = sorted({n.pool.region for n in nodes})
    alive = {i.instance_id for i in ctl.need_compute().list_tagged(regions) if i.job_id in (None, job.job_id)}
    vanished = {n.node_id for n in nodes if n.instance_id not in alive and n.state not in _DEAD}
    for node_id in vanished:
        ctl.store.update_node(job.job_id, node_id, lambda n: n.model_copy(update={"state": NodeState.LOST})
                              if n.state not in _DEAD else None)
    marked = [n.model_copy(update={"state": NodeState.LOST}) if n.node_id in vanished else n for n in nodes]
    return marked, sorted(n.rank for n in nodes if n.node_id in vanished)


def _settled_end(ctl: Controller, job: Job, nodes: list[Node], end: AttemptEnd, timings: WorkflowTimings,
                 now: float) -> tuple[AttemptEnd, list[Node]]:
    """The end settle classified, as is; a timed-out wait (which nobody settled) is classified here,
    once, after the silent nodes are marked lost; a crash that echoes a vanished peer becomes its loss."""
    if end.outcome.timed_out:
        nodes = _mark_unresponsive(ctl, job, nodes, end.outcome, timings, now)
        try:
            return classify_nodes(nodes), nodes
        except ValueError:  # nothing in the records explains it: treat the gang as lost
            return AttemptEnd(outcome=Verdict.NODE_LOST, attempt=job.attempt, reason=f"{end.outcome}",
                              lost_ranks=tuple(n.rank for n in nodes)), nodes
    if end.outcome in (Verdict.USER_ERROR, Verdict.INFRA_ERROR):
        nodes, vanished = _mark_vanished(ctl, job, nodes)
        if vanished:
            return end.as_loss(vanished), nodes
    return end, nodes


def recover(ctl: Controller, job_id: str, end: AttemptEnd, timings: WorkflowTimings, now: float) -> RecoveryPlan:
    job = ctl.store.get_job(job_id)
    if job.status is JobStatus.CANCELLING:
        raise JobCancelledError(f"job {job_id} is being cancelled")
    nodes = attempt_nodes(ctl.store, job)
    if job.status is JobStatus.RECOVERING:  # a retried task: the work is done, answer the same
        return _result(job, nodes, timings, end, "", ctl.store.nodes_of(job_id))
    outcome, nodes = _settled_end(ctl, job, nodes, end, timings, now)
    if outcome.outcome is Verdict.CANCELLED:
        raise JobCancelledError(f"job {job_id}: {outcome.reason}")
    spec = spec_of(job)
    stalled, progress = stall(job.stalled_recoveries, job.progress_step,
                              job.last_checkpoint.step if job.last_checkpoint else 0)
    decision = check_retry_budget(spec.recovery, outcome, job.recoveries, job.user_restarts, stalled)  # may raise

    current = job.attempts[-1] if job.attempts else None
    if current is not None and current.pool is not None and current.started_at is not None:
        hours = max(0.0, now - current.started_at) / 3600.0 * max(1, current.nodes)
        ctl.pool_stats.record(current.pool.key, PoolEvent.OBSERVED, now, hours=hours)
    keep, action, reason, plan_pool = _strategy(ctl, job, spec, outcome, nodes, now, last_chance(spec, stalled + 1),
                                                recovery_backoff_s(job, timings, outcome, now))
    if outcome.outcome is Verdict.USER_ERROR and action is not RecoveryAction.NEW_CLUSTER:
        keep = []  # a user restart relaunches in place only through a new gang (simple and clean)
        action = RecoveryAction.NEW_CLUSTER
    home = plan_pool if action is not RecoveryAction.NEW_CLUSTER else None
    spares = _promote_spares(ctl, job, home, nodes, keep)
    dropped = [n for n in nodes if n.instance_id not in keep] + spares
    if outcome.deadline is not None:  # a notice: ranks still saving drain; their replacements boot now
        dropped = _drain(ctl, job, dropped, outcome.deadline + DRAIN_GRACE_S)
    release_nodes(ctl, job, dropped, now)

    excluded = set(job.excluded_pools)
    if action is RecoveryAction.NEW_CLUSTER and current is not None and current.pool is not None and \
            outcome.outcome in (Verdict.INTERRUPTED, Verdict.NODE_LOST, Verdict.INFRA_ERROR):
        excluded.add(current.pool.key)  # plan again without the pool that just failed
    ckpt_step = job.last_checkpoint.step if job.last_checkpoint else 0
    price = price_in_effect(ctl, job, now)  # (asked once, not per retry of the write below)

    def to_recovering(cur: Job) -> Job | None:
        if cur.status is JobStatus.RECOVERING:
            return None
        update: dict[str, Any] = {
            "status": transition(cur.status, JobStatus.RECOVERING), "updated_at": now, "task_tokens": {},
            "recoveries": decision.recoveries, "user_restarts": decision.user_restarts,
            "stalled_recoveries": decision.stalled, "progress_step": progress,
            "excluded_pools": sorted(excluded),
        }
        update.update(_close_attempt(cur, now, outcome.outcome.value, nodes, price))
        update.update(_lost_steps(cur, update.get("attempts", cur.attempts), outcome.deadline, ckpt_step))
        # a rebalance standby that takes a rank: its time before this attempt goes into the ledger
        standbys = sum(standby_cost(cur, n, now) for n in ctl.store.nodes_of(job_id)
                       if n.spare and n.takes_rank is not None and n.release_after is not None)
        update["cost_so_far"] = update.get("cost_so_far", cur.cost_so_far) + standbys
        update["standby_cost"] = cur.standby_cost + standbys  # (kept apart: services/prewarm.py)
        return cur.model_copy(update=update)

    updated = ctl.store.update_job(job_id, to_recovering)
    if updated is not None:  # once per recovery, not per retry of this task
        ctl.measure("Recoveries", 1)
        ctl.measure("StepsLost", updated.steps_lost - job.steps_lost)
    job = updated or ctl.store.get_job(job_id)
    result = _result(job, attempt_nodes(ctl.store, job), timings, outcome, reason, ctl.store.nodes_of(job_id))
    advice = "; ".join(job_advice(job.spec, job.attempts))  # (what the job's own history says would help)
    announce(ctl.notifier, "interrupted", job, now, reason=outcome.reason, action=result.action.value,
             backoff_s=result.backoff_s, retry=decision.reason, **({"advice": advice} if advice else {}))
    log.info("recovering", extra={"job_id": job_id, **result.model_dump(mode="json")})
    return result


def _strategy(ctl: Controller, job: Job, spec: JobSpec, outcome: AttemptEnd, nodes: list[Node],
              now: float, chance: bool = False,
              backoff_s: int = 0) -> tuple[list[str], RecoveryAction, str, Pool | None]:
    """The spec's recovery strategy (plan_recovery): which nodes stay, the action, why, their pool
    (``backoff_s``: the wait before the next launch)."""
    try:
        assert ctl.market is not None
        res = spec.resources
        quotes = ctl.market.quotes(res.regions, res.instance_types, [m.value for m in res.markets],
                                   capacity=res.nodes + res.spares)  # the placement score is sized for the launch
        stats = ctl.pool_stats.get_many([q.pool.key for q in quotes])
        market, markets = ctl.market, [m.value for m in res.markets]
        plan = plan_recovery(RecoveryContext(spec=spec, outcome=outcome, nodes=nodes, quotes=quotes, stats=stats,
                                             now=now, excluded=frozenset(job.excluded_pools),
                                             quotes_for=lambda k: market.quotes(res.regions, res.instance_types,
                                                                                markets, capacity=k),
                                             last_chance=chance, backoff_s=backoff_s))
        return list(plan.keep_instance_ids), RecoveryAction(plan.action), plan.reason, plan.pool
    except NoPlacementError as exc:  # every pool cools down right now; Plan decides after the backoff
        log.info("no pool to recover into yet", extra={"job_id": job.job_id, "why": str(exc)})
        return [], RecoveryAction.NEW_CLUSTER, outcome.reason, None


def _promote_spares(ctl: Controller, job: Job, home: Pool | None, nodes: list[Node], keep: list[str]) -> list[Node]:
    """Hot spares in the survivors' pool take the lost ranks (``takes_rank``, the lowest first);
    returns the spares to release (all of them when a new gang goes elsewhere)."""
    takeovers, released = spare_takeovers(spare_nodes(ctl.store, job), home, nodes, keep,
                                          spec_of(job).resources.nodes)
    for spare, rank in takeovers:
        ctl.store.update_node(job.job_id, spare.node_id, _taking(rank))
    return released


def _lost_steps(job: Job, attempts: list[Attempt], deadline: float | None, kept: int) -> dict[str, Any]:
    """The ending attempt's steps past the newest checkpoint (``kept``), counted once. None after a
    notice: its emergency save is still to come (a drained rank's exit says if it missed:
    node_events._count_unsaved). None for a gang that never trained (say, lost while it booted as the
    last gang drained toward its own save)."""
    if deadline is not None or not attempts or attempts[-1].lost_steps is not None:
        return {}
    ending = attempts[-1]
    lost = 0 if ending.reached_step is None else max(0, ending.reached_step - kept)
    return {"attempts": [*attempts[:-1], ending.model_copy(update={"lost_steps": lost})],
            "steps_lost": job.steps_lost + lost}


def _taking(rank: int) -> Callable[[Node], Node | None]:
    return lambda n: n.model_copy(update={"takes_rank": rank}) if n.takes_rank is None else None


def _drain(ctl: Controller, job: Job, dropped: list[Node], until: float) -> list[Node]:
    """Dropped nodes still saving after a notice are left to finish (``release_after``): the agent
    event of their exit, or reconcile after ``until``, releases them. Returns the rest (release now),
    including a node whose exit was recorded after it was read here: its exit event found no mark
    and released nothing, so unless released now it would stay in the gang (``_result`` keeps it)."""
    release = [n for n in dropped if n.state not in _SAVING]
    for node in (n for n in dropped if n.state in _SAVING):
        marked = ctl.store.update_node(job.job_id, node.node_id, lambda n: n.model_copy(
            update={"release_after": until}) if n.state in _SAVING and n.release_after is None else None)
        if marked is None:
            fresh = ctl.store.get_node(job.job_id, node.node_id)
            if fresh.state not in _SAVING and fresh.release_after is None:
                release.append(fresh)
    return release


def _result(job: Job, nodes: list[Node], timings: WorkflowTimings, end: AttemptEnd, reason: str,
            job_spares: list[Node]) -> RecoveryPlan:
    """The plan as the job store now holds it: whatever still runs is kept (a retried task answers
    the same), every other rank is launched in the survivors' pool."""
    # exited ranks' instances still run; draining ones (release_after) are not kept
    keep = sorted((n for n in nodes if n.state not in _DEAD and n.release_after is None), key=lambda n: n.rank)
    ranks = {n.rank for n in keep}
    size = _world_after(job, len(nodes))
    promoted = [Promotion(rank=int(n.takes_rank), instance_id=n.instance_id) for n in job_spares
                if n.spare and n.takes_rank is not None and n.takes_rank not in ranks and n.state in SPARE_LIVE]
    launch = [r for r in range(size) if r not in ranks and r not in {p.rank for p in promoted}]
    pools = {n.pool for n in keep}
    pool = pools.pop() if len(pools) == 1 else None
    if not keep or pool is None:
        action = RecoveryAction.NEW_CLUSTER
    else:
        action = RecoveryAction.REPLACE_LOST if launch else RecoveryAction.RESTART_IN_PLACE
    return RecoveryPlan(
        action=action, outcome=end.outcome, reason=reason,
        deadline=None if end.deadline is None else end.deadline + DRAIN_GRACE_S,
        # after a notice the replacements are wanted now: the window is the time they have to boot
        backoff_s=recovery_backoff_s(job, timings, end),
        recoveries=job.recoveries, user_restarts=job.user_restarts,
        pool=pool if action is not RecoveryAction.NEW_CLUSTER else None,
        keep_instance_ids=[n.instance_id for n in keep] if action is not RecoveryAction.NEW_CLUSTER else [],
        launch_ranks=launch if action is not RecoveryAction.NEW_CLUSTER else list(range(size)),
        promoted=promoted if action is not RecoveryAction.NEW_CLUSTER else [],
    )
