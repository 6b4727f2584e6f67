"""The workflow's Review task: the outcome wait timed out at ``$.launch.review_s`` while the attempt
trains. Ask placement whether a clearly better placement exists now (``placement/review.py``).

- Silent (no heartbeat from the gang within ``timings.heartbeat_s``): ``AttemptEnd(HEARTBEAT_TIMEOUT)``,
  recovered like the wait's own heartbeat timeout.
- Poll or full review (placement/cadence.py): the wait times out every ``review_minutes``; a poll
  reads the spot prices alone and stays, unless the backoff is due (``$.launch.review_backoff``) or
  the prices moved since the last full review (``$.launch.review_mark``): then it scores the pools
  and decides (``decide``). A read holding a catalog price where the market could not be read
  (``PoolQuote.fallback``) marks nothing (``reading_mark``): the last mark stands.
- Stay (the usual answer): ``AttemptEnd(READY)`` with ``review_s``, the next poll (the ASL's
  NextReview state writes it to ``$.launch.review_s``), ``review_mark``, the mark of the prices the
  last full review read (NextReviewMark), and ``review_backoff``, when the next full review is due
  (NextReviewBackoff: a full review that stays doubles the interval that just ended, up to 16x
  ``review_minutes``, never past the moment its spot evidence expires, and keeps it when the prices
  moved); the workflow waits for the outcome again (a new token; ``register_wait`` settles at once if
  the attempt ended meanwhile). So a healthy attempt that trains longer than
  ``timings.outcome_timeout_s`` is never ended for it.
- Move: ``AttemptEnd(MIGRATE)`` with the target (pool, gang size); nothing is touched yet. The
  workflow's Migrate state (``services/migrate.py``) launches the new gang first and only then tells
  the old ranks to save (make-before-break); no capacity there: it waits for the outcome again.

An execution of a definition older than the polls passes no ``review_backoff``: every call is a full
review and ``review_s`` the backoff itself, as before (``polls`` False).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from spotrelay.contracts.recovery import AttemptEnd, Candidate, ReviewBackoff, Verdict
from spotrelay.contracts.workflow import WorkflowTimings
from spotrelay.domain.advice import notice_risk_share
from spotrelay.domain.models import Attempt, Job, Node, NodeState, Pool
from spotrelay.domain.status import JobStatus
from spotrelay.placement.cadence import (
    base_review_s,
    full_review_due,
    kept_mark,
    next_review_s,
    poll_s,
    price_mark,
    prices_moved,
)
from spotrelay.placement.gang_fit import probe_sizes, scores_of
from spotrelay.placement.payback import spot_stint_hours
from spotrelay.placement.policy import loss_interval
from spotrelay.placement.review import Move, better_placement, evidence_expires_at, keep_to_schedule, review_spot_hours
from spotrelay.placement.spot_evidence import off_on_demand_allowed, stall_limit, wall_limit
from spotrelay.ports.market import PoolQuote
from spotrelay.services.controller import Controller, attempt_nodes, spec_of
from spotrelay.spec.models import JobSpec

log = logging.getLogger(__name__)
_TRAINING = (NodeState.READY, NodeState.RUNNING)


def review_seconds(spec: JobSpec, timings: WorkflowTimings | None) -> int:
    """The outcome wait's timeout after a new attempt: the spec's ``recovery.review_minutes``, never
    longer than ``timings.outcome_timeout_s`` (placement/cadence.py's ``base_review_s``)."""
    return base_review_s(spec.recovery.review_minutes, (timings or WorkflowTimings()).outcome_timeout_s)


def next_review_seconds(spec: JobSpec, timings: WorkflowTimings | None, current_s: int | None,
                        attempts: list[Attempt], now: float, moved: bool = False) -> int:
    """The interval to the next review after one that stayed (placement/cadence.py's backoff from the
    spec's ``review_minutes``, bounded by ``timings.outcome_timeout_s`` and by the moment the review's
    spot evidence expires; ``moved``: the prices moved since the last review, not doubled). The
    simulator calls this too."""
    ceiling = (timings or WorkflowTimings()).outcome_timeout_s
    last = attempts[-1] if attempts else None
    expires = evidence_expires_at(attempts, last.pool.market if last and last.pool else "spot", now)
    return next_review_s(current_s, review_seconds(spec, timings), ceiling,
                         None if expires is None else expires - now, moved=moved)


def stay_fields(spec: JobSpec, timings: WorkflowTimings | None, attempts: list[Attempt], now: float,
                read: Decision, last_mark: str | None, backoff: Mapping[str, Any] | None,
                current_s: int | None = None, polls: bool = True) -> dict[str, Any]:
    """A stay's ``review_s`` (the outcome wait's next timeout), ``review_mark`` (the mark of the prices
    the last full review read) and ``review_backoff`` (when the next full review is due: ``backoff``, the
    last one, as the workflow holds it, ``ReviewBackoff``'s fields), after a review that read ``read``
    (its mark: None when it read no prices; ``full``: it scored the pools). Only a full review moves the
    backoff. ``polls`` False (an older definition): ``review_s`` is the backoff, from ``current_s``, the
    interval that just ended. The simulator's stays carry these too (plain values: it stays often)."""
    moved = prices_moved(read.mark, last_mark)
    if not polls:
        return {"review_s": next_review_seconds(spec, timings, current_s, attempts, now, moved),
                "review_mark": kept_mark(read.mark, last_mark)}
    if read.full:
        last_gap = None if backoff is None or read.keep_pace else backoff["gap_s"]
        gap = next_review_seconds(spec, timings, last_gap, attempts, now, moved or read.keep_pace)
        backoff = {"due": now + gap, "gap_s": gap}
    return {"review_s": poll_s(review_seconds(spec, timings), None if backoff is None else backoff["due"], now),
            "review_mark": kept_mark(read.mark, last_mark), "review_backoff": backoff}


def stay_answer(spec: JobSpec, timings: WorkflowTimings | None, attempt: int, why: str, attempts: list[Attempt],
                now: float, read: Decision, last_mark: str | None, backoff: ReviewBackoff | None,
                current_s: int | None = None, polls: bool = True) -> AttemptEnd:
    """The stay: READY with ``stay_fields``."""
    last = None if backoff is None else backoff.model_dump()
    return AttemptEnd(outcome=Verdict.READY, attempt=attempt, reason=why,
                      **stay_fields(spec, timings, attempts, now, read, last_mark, last, current_s, polls))


class Decision(NamedTuple):
    move: Move | None  # None: stay
    mark: str | None  # the mark of the prices the review read (None: it read none)
    full: bool = False  # it scored the pools (a full review); False: it read the prices alone, or nothing
    # recovery.max_slowdown: the job is behind its schedule, so the next full review comes after review_minutes
    # (no backoff): a spot gang falling behind is caught, an on-demand one back on schedule returns, in time
    keep_pace: bool = False


NOTHING_READ = Decision(None, None)


def decide(ctl: Controller, job: Job, now: float, time_scale: float = 1.0, last_mark: str | None = None,
           due: float | None = None) -> Decision:
    """The move placement recommends for this job's running attempt (None: stay), with the mark of
    the prices it read. ``due``: when the next full review is due (``ReviewBackoff.due``; None: now):
    before then, it reads the spot prices alone and stays unless they moved since ``last_mark`` (a
    poll: no placement scores asked). ``time_scale``: clock seconds per modeled second
    (``WorkflowTimings.time_scale``): the compute's boot estimate is on the clock (the twin's boots run
    faster), the move's cost in modeled hours."""
    spec = spec_of(job)
    current = job.attempts[-1] if job.attempts else None
    if spec.recovery.review_minutes <= 0 or current is None or current.pool is None or job.stop_save_by is not None:
        return NOTHING_READ  # (a pending stop: the ranks save to end the job, services/stop.py)
    nodes = attempt_nodes(ctl.store, job)
    if job.status is not JobStatus.RUNNING or not nodes or any(n.state not in _TRAINING for n in nodes):
        return NOTHING_READ  # something is already happening to the attempt: the outcome wait decides
    assert ctl.market is not None
    res = spec.resources
    markets = [m.value for m in res.markets]
    if not full_review_due(now, due, None, None):  # not due by the clock: a poll, the prices alone
        mark = reading_mark(ctl.market.quotes(res.regions, res.instance_types, markets, scores=False))
        if not prices_moved(mark, last_mark):
            return Decision(None, mark)
    quotes = ctl.market.quotes(res.regions, res.instance_types, markets, capacity=res.nodes + res.spares)
    mark = reading_mark(quotes)
    here = next((q for q in quotes if q.pool == current.pool), None)
    if here is None:
        return Decision(None, mark, True)
    stats = ctl.pool_stats.get_many([q.pool.key for q in quotes])
    world = current.world_size or len([n for n in nodes if not n.spare])
    sized = {m: scores_of(ctl.market.quotes(res.regions, res.instance_types, markets, capacity=m))
             for m in probe_sizes(spec)}  # elastic sizes
    move = better_placement(spec, here, world, quotes, stats, now, frozenset(job.excluded_pools),
                            spot_hours=review_spot_hours(job.attempts, current.pool.market, now), sized=sized,
                            stint_hours=spot_stint_hours(job.attempts, earlier=job.earlier),
                            boot_s=_modeled_boot(ctl, time_scale))
    move, keep_pace = keep_to_schedule(spec, here, world, quotes, stats, now, job.attempts, move,  # max_slowdown
                                       frozenset(job.excluded_pools), boot_s=_modeled_boot(ctl, time_scale),
                                       since=job.created_at, earlier=job.earlier)
    if move is not None and not off_on_demand_allowed(move.target.pool.market, current.pool.market,
                                                      job.attempts, quotes, now, stalled=stall_limit(spec),
                                                      wall=wall_limit(spec, job.created_at, job.earlier),
                                                      earlier=job.earlier):
        move = None  # the job's spot attempts cost more per useful step than on-demand (spot_evidence)
    return Decision(move, mark, True, keep_pace=keep_pace)


def reading_mark(quotes: list[PoolQuote]) -> str | None:
    """The price mark of what a review read (``price_mark``), or None when any price in it is a fallback
    (``PoolQuote.fallback``: the market could not be read, say EC2 throttled a region's price history):
    a catalog price against a reading would look like a move each time the reads fail and recover, and
    bring a full review each time. None reads as "no prices read": the last mark is kept (``kept_mark``)
    and the next reading is compared with it."""
    if any(q.fallback for q in quotes):
        return None
    return price_mark((q.pool.key, q.price_per_hour) for q in quotes)


def _modeled_boot(ctl: Controller, time_scale: float) -> Callable[[Pool], float] | None:
    """Seconds from a launch in a pool to NodeReady, modeled (None without a compute: the review's default)."""
    compute = ctl.compute
    if compute is None:
        return None
    return lambda pool: compute.expected_boot_s(pool) / time_scale


def silent(nodes: list[Node], heartbeat_s: float, now: float) -> bool:
    """No live node of the gang spoke within ``heartbeat_s`` (an engine may report the outcome
    wait's missed heartbeat as a plain timeout: the review then ends the attempt as that)."""
    live = [n for n in nodes if n.state in (*_TRAINING, NodeState.PENDING)]
    return bool(live) and max((n.last_heartbeat or n.launched_at) for n in live) < now - heartbeat_s


def review(ctl: Controller, job_id: str, attempt: int, now: float,
           timings: WorkflowTimings | None = None, review_s: int | None = None,
           review_mark: str | None = None, review_backoff: ReviewBackoff | None = None,
           polls: bool = True) -> AttemptEnd:
    """``review_mark`` and ``review_backoff``: ``$.launch``'s, the last full review's mark and when the
    next one is due. ``polls`` False (a definition older than the polls): a full review each call, and
    ``review_s``, the interval that just ended, is the backoff."""
    job = ctl.store.get_job(job_id)
    if job.attempt != attempt or job.status.terminal:
        return stay_answer(spec_of(job), timings, job.attempt, f"attempt {attempt} is no longer current",
                           job.attempts, now, NOTHING_READ, review_mark, review_backoff, review_s, polls)
    timings = timings or WorkflowTimings()
    if silent(attempt_nodes(ctl.store, job), timings.heartbeat_s, now):
        return AttemptEnd(outcome=Verdict.HEARTBEAT_TIMEOUT, attempt=attempt, reason="the gang went silent")
    read = decide(ctl, job, now, timings.time_scale, review_mark,
                  review_backoff.due if polls and review_backoff else None)
    move = read.move
    if move is None:
        why = "no better placement" if read.full else "prices hold; the full review is not due"
        return stay_answer(spec_of(job), timings, job.attempt, why, job.attempts, now, read, review_mark,
                           review_backoff, review_s, polls)
    target = move.target
    log.info("placement review: move", extra={"job_id": job_id, "target": target.pool.key, "nodes": target.nodes,
                                              "gain_per_hour": round(move.gain_per_hour, 2),
                                              "move_cost": round(move.move_cost, 2)})
    leaving = [] if move.in_place else attempt_nodes(ctl.store, job)
    return AttemptEnd(outcome=Verdict.MIGRATE, attempt=attempt, reason=move.reason,
                      lost_ranks=tuple(sorted(n.rank for n in leaving)),
                      target=Candidate(pool=target.pool, price_per_hour=target.quote.price_per_hour,
                                       score=round(target.score, 4), nodes=target.nodes,
                                       loss_interval_s=loss_interval(target, at_risk=notice_risk_share(job.attempts))))
