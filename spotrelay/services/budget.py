"""The reconcile sweep's budget checks (``budget`` in the spec), on the job record's ledger.

- Warning: once the ledger, the open attempt's clock included, reaches ``budget.warn_at`` of
  ``max_total_cost`` (default 0.8), people are told once (``budget`` notification, SNS/Slack) and the
  job record keeps when (``budget_warned_at``), so a redelivered or later sweep does not tell them again.
- Stop: once the ledger a sweep and a save from now (``stop_lead_s``: the sweep period and the job's
  newest measured save, with headroom) reaches ``max_total_cost``, the running attempt's ranks save at
  their next step (services/stop.py) and its outcome wait then fails with ``BudgetExceededError`` (at
  once when no rank trains); the workflow's catch-all tears the job down and records FAILED, and
  ``spotrelay resume`` goes on from that save. Stopping that far ahead is what keeps the save's
  minutes within the budget. Plan refuses a new gang on the closed attempts alone (services/plan.py).
  The rule is domain/cost.py's, which the simulator calls too (sim/budget.py).
- Price in effect: the open attempt's clock is counted at its spot pool's price in effect, read hourly
  (``refresh_price``: ``DescribeSpotPriceHistory``, ``domain/cost.price_due``) for every job, so what
  ``spotrelay cost`` shows of the running attempt follows the bill with a budget or without; at its
  launch price until the first read. Its close reads it again over its whole life.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from spotrelay.domain.cost import (
    SWEEP_S,
    budget_reached_at,
    budget_stop,
    budget_warning,
    drains,
    price_due,
    spent_at,
    stop_lead_s,
)
from spotrelay.domain.models import Job, Node, NodeState
from spotrelay.errors import BudgetExceededError, ConflictError, NotFoundError
from spotrelay.services.controller import Controller, price_in_effect
from spotrelay.services.notify import announce
from spotrelay.services.stop import save_first
from spotrelay.spec.models import Budget

log = logging.getLogger(__name__)
WARN_AT_DEFAULT = Budget.model_fields["warn_at"].default
_GONE = (NodeState.TERMINATED, NodeState.LOST)  # no longer billed (an EXITED one runs until released)
SAVE_S = 600.0  # how long the budget's final save may take before the job is stopped without it


def limits(job: Job) -> tuple[float | None, float | None]:
    """(max_total_cost, warn_at) from the stored spec as a dict: one job's odd record (from an older
    release, or edited by hand) must not stop the sweep of every other job."""
    section = (job.spec or {}).get("budget") or {}
    try:
        limit, share = section.get("max_total_cost"), section.get("warn_at", WARN_AT_DEFAULT)
        return (None if limit is None else float(limit)), (None if share is None else float(share))
    except (TypeError, ValueError, AttributeError):
        log.warning("unreadable budget in the job record", extra={"job_id": job.job_id, "budget": section})
        return None, None


def refresh_price(ctl: Controller, job: Job, now: float) -> Job:
    """``job`` with its open spot attempt's price in effect read again when due (``price_due``: hourly),
    which the sweep's budget checks and the cost report then count its clock at. Every job, with a
    budget or without: a running attempt shown at its launch price for days drifts from the bill as the
    price moves (one call per running spot job an hour). A read that fails keeps the last price (the
    launch price before any) and waits for the next hour as well: a throttled API is not asked again
    every minute."""
    current = job.attempts[-1] if job.attempts else None
    if current is None or not price_due(current, now):
        return job
    price = price_in_effect(ctl, job, now)
    update: dict[str, float] = {"price_checked_at": now}
    if price is not None and price[0] == current.number:
        update["price_in_effect"] = price[1]

    def refreshed(cur: Job) -> Job | None:
        last = cur.attempts[-1] if cur.attempts else None
        if last is None or last.number != current.number or last.ended_at is not None:
            return None  # (it closed meanwhile: its close priced it)
        return cur.model_copy(update={"attempts": [*cur.attempts[:-1], last.model_copy(update=update)]})

    try:
        return ctl.store.update_job(job.job_id, refreshed) or ctl.store.get_job(job.job_id)
    except (ConflictError, NotFoundError):  # (busy or gone: the next sweep reads it; the others go on)
        log.info("open attempt's price not kept this sweep", extra={"job_id": job.job_id})
        return job


def _spent(job: Job, now: float) -> float:
    return spent_at(job.cost_so_far, job.attempts[-1] if job.attempts else None, now)


def draining_ranks(nodes: Iterable[Node]) -> list[tuple[int, float]]:
    """(attempt, launched_at) of the ranks still finishing a closed attempt's save (``release_after``):
    billed, and charged to the ledger only at their release."""
    return [(n.attempt, n.launched_at) for n in nodes
            if n.release_after is not None and not n.spare and n.state not in _GONE]


def draining(ctl: Controller, job: Job, now: float) -> tuple[float, float]:
    """``domain/cost.drains`` of the job's ranks still draining (``draining_ranks``)."""
    return drains(job.attempts, draining_ranks(ctl.store.nodes_of(job.job_id)), now)


def lead_s(job: Job, sweep_s: float) -> float:
    """How far ahead of its budget this job is stopped: a sweep and its newest measured save."""
    return stop_lead_s(sweep_s, job.last_checkpoint.duration_s if job.last_checkpoint else None)


def warn(ctl: Controller, job: Job, now: float, sweep_s: float = SWEEP_S) -> bool:
    """Tell people once that the budget is nearly spent; True when this sweep told them."""
    if job.budget_warned_at is not None or not job.spec:
        return False
    limit, share = limits(job)
    if limit is None:
        return False
    reason = budget_warning(_spent(job, now), limit, share)
    if reason is None:
        return False
    at = budget_reached_at(job.cost_so_far, job.attempts[-1] if job.attempts else None, limit)
    if at is not None:  # the running attempt's rate says when (a sweep and a save ahead of the budget)
        at -= lead_s(job, sweep_s)
        reason += time.strftime(", at %Y-%m-%d %H:%M UTC at the running attempt's rate", time.gmtime(at))
    claimed = ctl.store.update_job(job.job_id, lambda j: j.model_copy(update={"budget_warned_at": now})
                                   if j.budget_warned_at is None else None)
    if claimed is None:
        return False  # another sweep told them
    announce(ctl.notifier, "budget", claimed, now, reason=reason)
    log.warning("budget nearly spent", extra={"job_id": job.job_id, "reason": reason})
    return True


def stop_if_spent(ctl: Controller, job: Job, now: float, sweep_s: float = SWEEP_S) -> bool:
    """Once the ledger a sweep and a save ahead (``lead_s``) reaches ``max_total_cost``: the running
    attempt's ranks save (services/stop.py: its outcome wait fails with ``BudgetExceededError`` once
    they exited, or ``SAVE_S`` later), or, with no rank training, the wait fails now."""
    budget, _ = limits(job)
    token = job.task_tokens.get("outcome")
    if budget is None or not token or not job.attempts or job.stop_save_by is not None:
        return False
    reason = budget_stop(job.cost_so_far, job.attempts[-1], now, budget, lead_s(job, sweep_s), draining(ctl, job, now))
    if reason is None:
        return False
    noted = ctl.store.update_job(job.job_id, lambda j: j.model_copy(update={
        "reasons": [*j.reasons, f"budget: {reason}"]}) if j.task_tokens.get("outcome") == token else None)
    if noted is not None and save_first(ctl.store, noted, now, BudgetExceededError.__name__, reason, SAVE_S):
        log.warning("over budget: the ranks save, then the job stops", extra={"job_id": job.job_id,
                                                                              "reason": reason})
        return True
    # no rank to save: the wait fails now (the reason is on the record: not every runtime relays the cause)
    claimed = ctl.store.update_job(job.job_id, lambda j: j.model_copy(update={
        "task_tokens": {k: v for k, v in j.task_tokens.items() if k != "outcome"}, "updated_at": now})
        if j.task_tokens.get("outcome") == token else None)
    if claimed is None:
        return False
    try:
        ctl.need_workflow().send_failure(token, BudgetExceededError.__name__, reason)
    except ConflictError:
        return False
    log.warning("over budget", extra={"job_id": job.job_id, "reason": reason})
    return True
