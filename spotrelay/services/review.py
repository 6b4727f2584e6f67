"""The workflow's Review task: the outcome wait timed out at ``$.launch.review_s`` while the attempt
trains. Ask placement whether a clearly better placement exists now (``placement/review.py``).

- Silent (no heartbeat from the gang within ``timings.heartbeat_s``): ``AttemptEnd(HEARTBEAT_TIMEOUT)``,
  recovered like the wait's own heartbeat timeout.
- Stay (the usual answer): ``AttemptEnd(READY)`` with ``review_s``, the next review's interval
  (``next_review_seconds``: twice the one that just ended, up to 16x ``review_minutes``, never past
  the moment its spot evidence expires, and not doubled when the prices it read moved since the last
  review; the ASL's NextReview state writes it to ``$.launch.review_s``), and
  ``review_mark``, the mark of those prices (NextReviewMark: ``$.launch.review_mark``); the
  workflow waits for the outcome again (a new token; ``register_wait`` settles at once if the
  attempt ended meanwhile). So a healthy attempt that trains longer than
  ``timings.outcome_timeout_s`` is never ended for it.
- Move: ``AttemptEnd(MIGRATE)`` with the target (pool, gang size); nothing is touched yet. The
  workflow's Migrate state (``services/migrate.py``) launches the new gang first and only then tells
  the old ranks to save (make-before-break); no capacity there: it waits for the outcome again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, NamedTuple

from spotrelay.contracts.recovery import AttemptEnd, Candidate, Verdict
from spotrelay.contracts.workflow import WorkflowTimings
from spotrelay.domain.models import Attempt, Job, Node, NodeState, Pool
from spotrelay.domain.status import JobStatus
from spotrelay.placement.cadence import base_review_s, kept_mark, next_review_s, price_mark, prices_moved
from spotrelay.placement.gang_fit import probe_sizes, scores_of
from spotrelay.placement.payback import spot_stint_hours
from spotrelay.placement.policy import loss_interval
from spotrelay.placement.review import Move, better_placement, evidence_expires_at, review_spot_hours
from spotrelay.placement.spot_evidence import off_on_demand_allowed, stall_limit
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


def stay_fields(spec: JobSpec, timings: WorkflowTimings | None, current_s: int | None, attempts: list[Attempt],
                now: float, mark: str | None, last_mark: str | None) -> dict[str, Any]:
    """A stay's ``review_s`` (the next review's interval) and ``review_mark`` (the mark of the prices this
    review read, ``mark``; None when it read none: ``last_mark``, the last review's, is kept). The
    simulator's stay answer carries these too."""
    return {"review_s": next_review_seconds(spec, timings, current_s, attempts, now, prices_moved(mark, last_mark)),
            "review_mark": kept_mark(mark, last_mark)}


def stay_answer(spec: JobSpec, timings: WorkflowTimings | None, attempt: int, why: str, current_s: int | None,
                attempts: list[Attempt], now: float, mark: str | None, last_mark: str | None) -> AttemptEnd:
    """The stay: READY with ``stay_fields``."""
    return AttemptEnd(outcome=Verdict.READY, attempt=attempt, reason=why,
                      **stay_fields(spec, timings, current_s, attempts, now, mark, last_mark))


class Decision(NamedTuple):
    move: Move | None  # None: stay
    mark: str | None  # the mark of the prices the review read (None: it read none)


def decide(ctl: Controller, job: Job, now: float, time_scale: float = 1.0) -> Decision:
    """The move placement recommends for this job's running attempt (None: stay), with the mark of
    the prices it read. ``time_scale``: clock seconds per modeled second (``WorkflowTimings.time_scale``):
    the compute's boot estimate is on the clock (the twin's boots run faster), the move's cost in
    modeled hours."""
    spec = spec_of(job)
    current = job.attempts[-1] if job.attempts else None
    if spec.recovery.review_minutes <= 0 or current is None or current.pool is None or job.stop_save_by is not None:
        return Decision(None, None)  # (a pending stop: the ranks save to end the job, services/stop.py)
    nodes = attempt_nodes(ctl.store, job)
    if job.status is not JobStatus.RUNNING or not nodes or any(n.state not in _TRAINING for n in nodes):
        return Decision(None, None)  # something is already happening to the attempt: the outcome wait decides
    assert ctl.market is not None
    res = spec.resources
    quotes = ctl.market.quotes(res.regions, res.instance_types, [m.value for m in res.markets],
                               capacity=res.nodes + res.spares)
    mark = price_mark((q.pool.key, q.price_per_hour) for q in quotes)
    here = next((q for q in quotes if q.pool == current.pool), None)
    if here is None:
        return Decision(None, mark)
    stats = ctl.pool_stats.get_many([q.pool.key for q in quotes])
    world = current.world_size or len([n for n in nodes if not n.spare])
    sized = {m: scores_of(ctl.market.quotes(res.regions, res.instance_types, [mk.value for mk in res.markets],
                                             capacity=m)) for m in probe_sizes(spec)}  # elastic sizes
    move = better_placement(spec, here, world, quotes, stats, now, frozenset(job.excluded_pools),
                            spot_hours=review_spot_hours(job.attempts, current.pool.market, now), sized=sized,
                            stint_hours=spot_stint_hours(job.attempts),
                            boot_s=_modeled_boot(ctl, time_scale))
    if move is not None and not off_on_demand_allowed(move.target.pool.market, current.pool.market,
                                                      job.attempts, quotes, now, stalled=stall_limit(spec)):
        move = None  # the job's spot attempts cost more per useful step than on-demand (spot_evidence)
    return Decision(move, mark)


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
           review_mark: str | None = None) -> AttemptEnd:
    """``review_s``: the interval that just ended (``$.launch.review_s``); a stay doubles it unless the
    prices moved since ``review_mark`` (``$.launch.review_mark``, the mark of the last review's)."""
    job = ctl.store.get_job(job_id)
    if job.attempt != attempt or job.status.terminal:
        return stay_answer(spec_of(job), timings, job.attempt, f"attempt {attempt} is no longer current", review_s,
                           job.attempts, now, None, review_mark)
    timings = timings or WorkflowTimings()
    if silent(attempt_nodes(ctl.store, job), timings.heartbeat_s, now):
        return AttemptEnd(outcome=Verdict.HEARTBEAT_TIMEOUT, attempt=attempt, reason="the gang went silent")
    move, mark = decide(ctl, job, now, timings.time_scale)
    if move is None:
        return stay_answer(spec_of(job), timings, job.attempt, "no better placement", review_s, job.attempts, now,
                           mark, review_mark)
    target = move.target
    log.info("placement review: move", extra={"job_id": job_id, "target": target.pool.key, "nodes": target.nodes,
                                              "gain_per_hour": round(move.gain_per_hour, 2),
                                              "move_cost": round(move.move_cost, 2)})
    leaving = [] if move.in_place else attempt_nodes(ctl.store, job)
    return AttemptEnd(outcome=Verdict.MIGRATE, attempt=attempt, reason=move.reason,
                      lost_ranks=tuple(sorted(n.rank for n in leaving)),
                      target=Candidate(pool=target.pool, price_per_hour=target.quote.price_per_hour,
                                       score=round(target.score, 4), nodes=target.nodes,
                                       loss_interval_s=loss_interval(target)))
