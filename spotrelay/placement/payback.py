"""Does a review's move off on-demand pay back before the job is back on on-demand? Pure.

A gang parked on on-demand that moves to spot does not stay there for ``horizon_hours``: on a
market whose pools cannot hold the gang long it is back on on-demand within an hour or two (a
*stint*: from the first spot attempt after on-demand to the next on-demand attempt). Each stint
pays for the round trip: the move (the new gang's boot and restore, the old gang's save), the
restore after it, and the return's boot and restore on on-demand. While the gang restores it does
no work, and that work is valued at what the on-demand gang would have cost to do it.

So, with the job's own evidence (its last ``STINT_EVIDENCE`` stints), a move from on-demand to spot
must save, over the mean of those stints, more than that round trip (with the review's margin)::

    round_trip = move_cost + od_gang_price * (move_restore_h + return_restore_h)
    move when gain * min(horizon, mean_stint_h) > round_trip * (1 + margin)

Without a stint yet the review keeps its plain test (``placement/review.py``). The evidence has no
age limit: it is a bar the saving must clear, not a blindfold; a larger saving (a cheaper or
steadier spot pool) still moves the gang (docs/placement.md, "Review").
"""

from __future__ import annotations

from spotrelay.domain.models import Attempt, Earlier

STINT_EVIDENCE = 3  # a review from on-demand weighs the job's last this many spot stints


def _on_spot(a: Attempt) -> bool:
    return a.pool is not None and a.pool.market == "spot"


def stints(attempts: list[Attempt], spans: list[float] | None = None,
           stint_from: float | None = None) -> tuple[list[float], float | None]:
    """(the closed spot stints' lengths in hours, oldest first; the open stint's start or None) after
    ``attempts``, going on from ``spans`` and ``stint_from`` (a job record's folded attempts: ``Earlier``).
    A stint is a run of consecutive spot attempts, from the first one's start to the start of the
    on-demand attempt after it; attempts without a pool or a start time are skipped."""
    spans = list(spans or ())
    for a in attempts:
        if a.pool is None or a.started_at is None:
            continue
        if _on_spot(a):
            if stint_from is None:
                stint_from = a.started_at
        elif stint_from is not None:  # back on on-demand: the stint closes
            spans.append(max(0.0, a.started_at - stint_from) / 3600.0)
            stint_from = None
    return spans, stint_from


def spot_stint_hours(attempts: list[Attempt], last: int = STINT_EVIDENCE,
                     earlier: Earlier | None = None) -> float | None:
    """Mean length in hours of the job's last ``last`` spot stints that ended on on-demand (None: no such
    stint yet; a stint still running, no on-demand attempt after it yet, does not count). ``earlier``: the
    job record's folded attempts, whose stints come first."""
    spans, _ = stints(attempts, earlier.stints_h if earlier else None, earlier.stint_from if earlier else None)
    recent = spans[-last:] if last > 0 else []
    return sum(recent) / len(recent) if recent else None


def round_trip_cost(move_cost: float, od_gang_price_per_hour: float, move_restore_h: float,
                    return_restore_h: float) -> float:
    """USD a stint away from on-demand costs besides its spot bill: the move itself (``move_cost``:
    the new gang's boot and restore, the old one's save), and the work the gang does not do while
    it restores after the move and after the return (valued at the on-demand gang's price)."""
    return move_cost + od_gang_price_per_hour * (move_restore_h + return_restore_h)
