"""The job record's attempts in the simulator, kept as the services keep them: opened at a launch
(``workflow_tasks.provision``, ``migrate``), closed with their cost at the price in effect over their
life (``workflow_tasks._close_attempt``), the trainers' resume (``node_events._on_resumed``) and the
newest checkpoint their ranks committed (``node_events._on_checkpoint``). Placement reads them (the
review's spot evidence, the backoff streak, ``placement/spot_evidence.py``'s realized cost per useful
step)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from spotrelay.domain.cost import closed_attempt, mean_price, open_spot, outlived_cost
from spotrelay.domain.models import Attempt, Job
from spotrelay.domain.status import JobStatus
from spotrelay.services import history
from spotrelay.sim import budget

if TYPE_CHECKING:
    from spotrelay.sim.controller import SpotrelayRun
    from spotrelay.sim.records import SimNode

PLAN_ATTEMPTS = 50  # the newest attempts the Plan's light job record holds (it reads no further back)


def light_job(run: SpotrelayRun) -> Job:
    """The job record fields the services' pure helpers read: the newest ``PLAN_ATTEMPTS`` attempts
    (what they read of them) and the ones before folded as the job record folds its old ones
    (``services/history.fold``: where the schedule starts, ``Earlier``)."""
    while run.folded_n < len(run.attempts) - PLAN_ATTEMPTS:
        run.folded = history.fold(run.folded, run.attempts[run.folded_n])
        run.folded_n += 1
    return Job(job_id="sim", name="sim", status=JobStatus.RECOVERING, attempt=run.attempt,
               created_at=run.created_at, recoveries=run.recoveries, user_restarts=run.user_restarts,
               stalled_recoveries=run.stalled, attempts=run.attempts[-PLAN_ATTEMPTS:], earlier=run.folded,
               excluded_pools=sorted(run.excluded), spec={"resources": {"nodes": run.job.nodes}})


def opened(run: SpotrelayRun, number: int, pool: Any, price: float, nodes: int, world: int, kept: int = 0,
           loss_interval_s: float | None = None) -> None:
    """``kept``: of ``nodes``, those carried over from the attempt before (survivors, promoted spares);
    ``loss_interval_s``: the launch candidate's (the auto checkpoint cadence's input)."""
    run.attempts.append(Attempt(number=number, pool=pool, started_at=run.now, price_per_hour=price,
                                nodes=nodes, world_size=world, kept=kept, loss_interval_s=loss_interval_s))
    budget.watch(run)


def close(run: SpotrelayRun, reason: str, noticed: bool = False) -> None:
    """The current attempt ends now (recover, a move) for ``reason`` (the verdict, as the services
    record it: describe's advice reads it): its clock stops and its cost is added; ``noticed`` (recover,
    as recovery_flow passes the attempt's records): less what EC2 will not bill of the gang's instances
    it noticed in their first hour."""
    if run.attempts and run.attempts[-1].ended_at is None:
        # as workflow_tasks._close_attempt
        seen = [(n.launch_t, n.removal_t) for n in run.gang.values() if n.instance_id in run.ec2_noticed] \
            if noticed else []
        run.attempts[-1] = closed_attempt(run.attempts[-1], run.now, reason, seen, price_in_effect(run))
        run.cost_so_far += run.attempts[-1].cost  # (the job record's cost_so_far)


def price_in_effect(run: SpotrelayRun) -> float | None:
    """``controller.price_in_effect`` of the open attempt: its spot pool's slot prices over its life."""
    a = run.attempts[-1]
    sp = run.market.by_key.get(a.pool.key) if open_spot(a) and a.pool is not None else None
    if sp is None or a.started_at is None:
        return None
    return mean_price(sp.price_history(a.started_at, run.now), a.started_at, run.now, a.price_per_hour)


def outlived(run: SpotrelayRun, node: SimNode) -> None:
    """``controller.charge_outlived_nodes``: ``node``, released now or carried into the next attempt,
    was billed past its attempt's close (a rank finishing a notice's or a move's save, a survivor kept
    while its replacements were placed): that time goes into the ledger, once (the caller's moment)."""
    for i in range(len(run.attempts) - 1, -1, -1):
        a = run.attempts[i]
        if a.number == node.attempt:
            if not node.spare:
                # (the record's drain_cost is not copied per node: a stormy run releases thousands of drained
                # ranks a job-month, no decision reads it, and ``drained_usd`` keeps the sum)
                extra = outlived_cost(a, node.launch_t, run.now)
                run.cost_so_far += extra
                run.drained_usd += extra
            return
        if a.number < node.attempt:
            return


def _newest(run: SpotrelayRun, number: int) -> int | None:
    """The index of attempt ``number``'s newest record, or None."""
    for i in range(len(run.attempts) - 1, -1, -1):
        if run.attempts[i].number == number:
            return i
    return None


def update(run: SpotrelayRun, number: int, update: dict[str, Any]) -> None:
    """Attempt ``number``'s record with ``update`` (the newest attempt with that number)."""
    i = _newest(run, number)
    if i is not None:
        run.attempts[i] = run.attempts[i].model_copy(update=update)


def notice_at_risk(run: SpotrelayRun, number: int) -> None:
    """node_events._on_notice_at_risk: a notice reached attempt ``number``'s ranks with less time than their
    save takes (the agent's deadline-at-risk); marked once."""
    i = _newest(run, number)
    if i is not None and not run.attempts[i].notice_at_risk:
        run.attempts[i] = run.attempts[i].model_copy(update={"notice_at_risk": True})


def resumed(run: SpotrelayRun, number: int, step: int) -> None:
    """TrainingResumed: the first resume of the attempt."""
    i = _newest(run, number)
    if i is not None and run.attempts[i].resumed_from_step is None:
        run.attempts[i] = run.attempts[i].model_copy(update={"resumed_from_step": step, "resumed_at": run.now})


def commit_t(run: SpotrelayRun, step: int) -> float:
    """When the training segment's ranks committed ``step`` (a forced save's commit time, else the
    periodic one's: trained to it, then persisted)."""
    forced = [when for when, s in run.forced if s == step]
    return min(forced) if forced else run.seg_t0 + (step - run.seg_step0) * run.step_eff + run.job.persist_s()


def as_of_now(run: SpotrelayRun) -> list[Attempt]:
    """The attempts as the job record holds them now: the training gang's newest committed checkpoint on
    its attempt, as the services record each CheckpointCommitted when it lands (the simulator's periodic
    checkpoints are arithmetic: they reach ``run.attempts`` when training stops). A copy."""
    if not run.running:
        return run.attempts
    i = _newest(run, run.seg_attempt)
    step = run.committed(run.now)
    if i is None or step <= run.seg_step0:
        return run.attempts
    a = run.attempts[i]
    if a.saved_step is not None and step <= a.saved_step:
        return run.attempts
    now = list(run.attempts)
    now[i] = a.model_copy(update={"saved_step": step, "saved_at": min(commit_t(run, step), run.now)})
    return now


def saved(run: SpotrelayRun, number: int, step: int, at: float) -> None:
    """CheckpointCommitted by the ranks of attempt ``number`` (its newest only)."""
    i = _newest(run, number)
    if i is not None:
        a = run.attempts[i]
        if a.saved_step is None or step > a.saved_step:
            run.attempts[i] = a.model_copy(update={"saved_step": step, "saved_at": at})
