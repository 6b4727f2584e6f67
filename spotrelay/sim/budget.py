"""The job's ``budget.max_total_cost`` in the simulator, enforced where the services enforce it.

- Plan refuses a new gang once the closed attempts' cost reached it (``services/plan.py``: the same
  ``over_budget``), or when what is left would not pay for any candidate gang to boot and save
  (``affordable``; a candidate it cannot pay is dropped): ``BudgetExceededError``, the ASL's FailJob.
- The reconcile sweep (every ``RECONCILE_S``, cdk/config.py's ``reconcile_minutes``) fails the outcome
  wait of a running attempt whose ledger, its open clock included (``spent_at``), reaches it a sweep
  and a save from now (``budget_stop``, ``stop_lead_s``: the save the controller has measured is the
  newest periodic one, its stall and upload). The sweep is not simulated minute by minute: the run
  asks when the open attempt's clock comes that close to the budget (``budget_reached_at`` less the
  lead) and looks at the first sweep from then; not in the outcome wait then (the gang boots, a review
  or a move runs), it looks again a sweep later, as the reconcile does.

The open attempt's clock counts at its spot price in effect, read at the first sweep an hour after its
start and hourly after (``services/budget.refresh_price``, ``domain/cost.price_due``; here from its
pool's slots): a read changes when the clock reaches the budget, so the watch is made again then.

The ledger is the job record's (prices x nodes x time, what ``describe``/``cost`` show), not
the market's billing the result reports: the job stops when its *record* says it spent the budget.
The ranks save first (services/stop.py): training stops at the sweep's step, the save commits
``JobModel.flush_s`` later (billed), and then the wait fails; nothing trained is lost. A review that
falls due inside that flush is not run (the services run it and it stays: the ranks are exiting).
"""

from __future__ import annotations

import math
from functools import partial
from typing import TYPE_CHECKING

from spotrelay.contracts.recovery import LaunchPlan
from spotrelay.domain.cost import (
    SWEEP_S,
    budget_reached_at,
    budget_stop,
    drains,
    over_budget,
    price_due,
    price_read_at,
    spent_with_drains,
    stop_lead_s,
)
from spotrelay.domain.models import Job
from spotrelay.errors import BudgetExceededError
from spotrelay.services.plan import affordable
from spotrelay.sim import attempts
from spotrelay.sim.asl import TaskFailed

if TYPE_CHECKING:
    from spotrelay.sim.controller import SpotrelayRun

RECONCILE_S = SWEEP_S  # the reconcile schedule's default period, as the services assume it


def _limit(run: SpotrelayRun) -> float | None:
    return run.spec.budget.max_total_cost


def check_plan(run: SpotrelayRun) -> None:
    """plan.plan: no new gang once the closed attempts spent the budget."""
    reason = over_budget(run.cost_so_far, _limit(run))
    if reason is not None:
        run.metrics.failed_reason = f"budget: {reason}"
        raise TaskFailed(BudgetExceededError.__name__, reason)


def _lead_s(run: SpotrelayRun, saved: bool | None = None) -> float:
    """services/budget.lead_s: a sweep and the newest periodic save's stall and upload, once one committed
    (``saved``: as if one had, or not)."""
    pool = run.attempt_pool
    if saved is None:
        saved = run.committed(run.now) > 0
    save = run.job.stall_s(pool.pool.instance_type) + run.job.persist_s() if saved and pool is not None else None
    return stop_lead_s(RECONCILE_S, save)


def check_launch(run: SpotrelayRun, job: Job, launch: LaunchPlan) -> LaunchPlan:
    """plan.affordable: near the budget's end, only gangs the rest pays to boot and save."""
    try:
        if _limit(run) is None:
            return launch
        lead = _lead_s(run)
        return affordable(run.spec, job, spent_with_drains(run.cost_so_far, _draining(run), lead), launch,
                          run.market.expected_boot_s, lead)
    except BudgetExceededError as exc:
        run.metrics.failed_reason = f"budget: {exc}"
        raise TaskFailed(BudgetExceededError.__name__, str(exc)) from None


def _draining(run: SpotrelayRun) -> tuple[float, float]:
    """services/budget.draining: a closed attempt's ranks still saving (released, and charged, at their exit)."""
    return drains(run.attempts, [(n.attempt, n.launch_t) for n in run.draining
                                 if n.end_t is None and not n.left_to_ec2 and not n.spare], run.now)


def _sweep_at(t: float) -> float:
    """The first reconcile sweep at or after ``t``."""
    return math.ceil(t / RECONCILE_S) * RECONCILE_S


def watch(run: SpotrelayRun) -> None:
    """An attempt opened, or its price in effect was read: look at the first reconcile sweep after its
    clock reaches the budget (every sweep while a closed attempt's ranks drain: their release adds to
    the ledger), and at the sweep that reads its price next. Replaces the watch before it."""
    limit = _limit(run)
    if limit is None or not run.attempts:
        return
    run.budget_watch += 1
    key = (run.attempts[-1].number, run.budget_watch)
    at = budget_reached_at(run.cost_so_far, run.attempts[-1], limit)
    if _draining(run)[1] > 0:
        at = run.now
    if at is not None:
        at -= min(_lead_s(run, True), _lead_s(run, False))  # (a save may commit before then: never late)
        run.at(_sweep_at(max(at, run.now)), partial(_sweep, run), key)
    read_at = price_read_at(run.attempts[-1])
    if read_at is not None:
        run.at(_sweep_at(max(read_at, run.now)), partial(_read_price, run), key)


def _watched(run: SpotrelayRun, key: tuple[int, int]) -> bool:
    """Whether ``key`` is the current watch of the open attempt of a run still going."""
    current = run.attempts[-1] if run.attempts else None
    return (key[1] == run.budget_watch and current is not None and current.number == key[0]
            and current.ended_at is None and not run.metrics.finished and run.metrics.failed_reason is None)


def _refresh(run: SpotrelayRun) -> bool:
    """services/budget.refresh_price: the open attempt's price in effect read now, when due."""
    current = run.attempts[-1]
    if not price_due(current, run.now):
        return False
    attempts.update(run, current.number, {"price_checked_at": run.now,
                                          "price_in_effect": attempts.price_in_effect(run)})
    return True


def _read_price(run: SpotrelayRun, key: tuple[int, int]) -> None:
    """The sweep that reads the open attempt's price: when the clock reaches the budget moved with it."""
    if _watched(run, key) and _refresh(run):
        watch(run)


def _sweep(run: SpotrelayRun, key: tuple[int, int]) -> None:
    if not _watched(run, key):
        return  # that attempt ended (its cost is closed: Plan or the next attempt's watch decides), or re-watched
    _refresh(run)  # (the services read a due price before the sweep's checks)
    current = run.attempts[-1]
    reason = budget_stop(run.cost_so_far, current, run.now, _limit(run), _lead_s(run), _draining(run))
    if reason is None or run.waiting != "outcome":  # (a launch price of 0 never gets here)
        if reason is None and _draining(run)[1] == 0:
            watch(run)  # the drains were charged: the next sweep that can stop the job, from the ledger now
        else:
            run.at(run.now + RECONCILE_S, partial(_sweep, run), key)  # stop_if_spent: outcome waits only
        return
    number = current.number
    run.note("", f"budget: {reason}")
    if not run.running:  # no rank trains (booting, restoring): nothing to save, the wait fails now
        _stop(run, (number, reason))
        return
    # services/stop.py: every rank saves at its next step (CHECKPOINT_NOW, no deadline) and exits once
    # it is committed; the outcome wait fails then. The nodes are billed through the flush.
    flush = run.job.flush_s()
    run.stop_training(int(run.step_at(run.now) + 1e-6))  # the ranks stop at the save: nothing trained is lost
    run.stop_pending = True  # the waits deliver no verdict meanwhile (services/waits.settle)
    run.at(run.now + flush, partial(_stop, run), (number, reason))


def _stop(run: SpotrelayRun, arg: tuple[int, str]) -> None:
    number, reason = arg
    if run.metrics.finished or run.metrics.failed_reason is not None or run.attempt != number:
        return
    run.metrics.failed_reason = f"budget: {reason}"
    run.stop_pending = False
    run.waiting = None
    run.fail_wait(BudgetExceededError.__name__)
