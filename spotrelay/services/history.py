"""A job record's attempts, bounded: the newest ``ATTEMPTS_KEPT`` in full, the older ones folded into
``Job.earlier`` (domain/models.Earlier).

The job item holds the whole record as JSON, and DynamoDB refuses an item over 400 KB: at ~600 bytes an
attempt, a job that kept every attempt could no longer be written after ~650 of them (moto refuses it
too), and a fixed 16-node gang on a stormy market starts one every half hour: two weeks. Every write
that adds an attempt (provision, a move) folds what falls out of the window. The readers of the whole
history take the folded part from ``Earlier`` and answer as they would over every attempt
(tests/unit/test_attempt_history.py holds each to that): the schedule's start and first step
(``spot_evidence.progress``), the returns to on-demand and the last spot end (``off_on_demand_allowed``),
the spot stints (``payback.spot_stint_hours``), the cost and savings totals (describe, the final
notification) and the downtime between attempts. Everything else reads the newest few attempts.
"""

from __future__ import annotations

from itertools import pairwise

from spotrelay.domain.models import Attempt, Earlier
from spotrelay.placement.payback import STINT_EVIDENCE, stints
from spotrelay.placement.spot_evidence import step_node_hours, trained_nothing_on_spot
from spotrelay.services import savings

ATTEMPTS_KEPT = 200


def fold(earlier: Earlier | None, a: Attempt) -> Earlier:
    """``earlier`` with attempt ``a`` (the oldest one kept until now) folded in."""
    e = earlier or Earlier()
    paid = a.cost + a.drain_cost
    on_demand = savings.on_demand_cost(a, paid)
    market = a.pool.market if a.pool is not None else None
    spans, stint_from = stints([a], e.stints_h, e.stint_from)
    gap = max(0.0, a.started_at - e.last_ended_at) if e.last_ended_at and a.started_at else 0.0
    return Earlier(
        count=e.count + 1,
        first_started_at=e.first_started_at if e.first_started_at is not None else a.started_at,
        first_resumed_from_step=(e.first_resumed_from_step if e.first_resumed_from_step is not None
                                 else a.resumed_from_step),
        saved_step=a.saved_step if e.saved_step is None else max(e.saved_step, a.saved_step or e.saved_step),
        measured=a if step_node_hours([a]) is not None else e.measured,
        paid=e.paid + paid,
        on_demand=None if e.on_demand is None or on_demand is None else e.on_demand + on_demand,
        unbilled=e.unbilled + a.unbilled,
        downtime_s=e.downtime_s + gap,
        last_ended_at=a.ended_at,
        last_market=market,
        returns_to_on_demand=e.returns_to_on_demand + int(e.count > 0 and e.last_market == "spot"
                                                          and market is not None and market != "spot"),
        last_spot_end=a.ended_at if market == "spot" and a.ended_at else e.last_spot_end,
        stalled_run=e.stalled_run if a.ended_at is None else (e.stalled_run + 1 if trained_nothing_on_spot(a) else 0),
        stints_h=spans[-STINT_EVIDENCE:],
        stint_from=stint_from,
    )


def kept(attempts: list[Attempt], earlier: Earlier | None,
         keep: int = ATTEMPTS_KEPT) -> tuple[list[Attempt], Earlier | None]:
    """(the newest ``keep`` attempts, ``earlier`` with the ones before them folded in): what a write that
    adds an attempt stores."""
    if len(attempts) <= keep:
        return attempts, earlier
    for a in attempts[:-keep]:
        earlier = fold(earlier, a)
    return attempts[-keep:], earlier


def downtime_s(attempts: list[Attempt], earlier: Earlier | None) -> float:
    """Seconds without training between attempts (each gap from an attempt's end to the next start),
    the folded ones included."""
    chain: list[tuple[float | None, float | None]] = [(a.started_at, a.ended_at) for a in attempts]
    if earlier is not None and earlier.count:
        chain.insert(0, (None, earlier.last_ended_at))
    gaps = [b[0] - a[1] for a, b in pairwise(chain) if a[1] and b[0]]
    return sum(max(0.0, g) for g in gaps) + (earlier.downtime_s if earlier is not None else 0.0)


def paid_and_on_demand(attempts: list[Attempt], earlier: Earlier | None) -> tuple[float, float | None]:
    """savings.finished_job over every attempt, the folded ones included."""
    paid, on_demand = savings.finished_job(attempts)
    if earlier is None:
        return paid, on_demand
    both = None if on_demand is None or earlier.on_demand is None else on_demand + earlier.on_demand
    return paid + earlier.paid, both
