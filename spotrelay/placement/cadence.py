"""How often the placement review runs: a poll every ``review_minutes``, and a full review that backs
off while it keeps deciding to stay. Pure.

A full review costs a Lambda, Step Functions transitions, and ``GetSpotPlacementScores`` calls, which
AWS rate-limits per account. Most reviews stay (a gang that no spot pool can hold is reviewed on
on-demand all month), so each full review that stays doubles the interval to the next one:
``review_minutes``, then 2x, 4x, up to ``REVIEW_BACKOFF_MAX`` x ``review_minutes`` (never past
``outcome_timeout_s``). A move, a recovery, or any other new attempt starts again: provision's
``Launched`` carries no backoff, so the attempt's first review (after ``review_minutes``) is a full one.

One input of the review changes with the clock alone: a gang on on-demand stops weighing its own
spot attempts once they are ``EVIDENCE_HOURS`` old (``placement.review.evidence_expires_at``), and
that is when spot is worth a look again. The backoff never waits past that moment; without this
bound a 16-node gang on the g4dn trace paid 3-4% more per useful GPU-hour (docs/simulator-tuning.md, "Speed rounds").

The other is the market itself, and the backoff does not blind the review to it. The outcome wait
times out every ``review_minutes`` (``poll_s``: shorter only to land on the backoff's due time), and
each poll reads the spot prices alone (DescribeSpotPriceHistory, no placement scores) and marks them
(``price_mark``; the ASL keeps the last full review's mark in ``$.launch.review_mark`` and its
``ReviewBackoff`` in ``$.launch.review_backoff``). A poll stays at once unless the backoff is due or
the mark moved (``full_review_due``); a full review that found the prices moved keeps the interval
instead of doubling it (the market moves at least that often). So a move is seen within one poll, not
at the end of an 8 h backoff, and ``GetSpotPlacementScores`` is asked only by full reviews (one more
per price move). Where every pool draws a new price each 6 h this cut spotrelay's cost per useful
GPU-hour by ~1% against full reviews alone (docs/simulator-tuning.md, "Price polls between
reviews"); where prices never move (the traces at catalog prices) the full reviews come as before.
The services (``services/review.py``) and the simulator call these same functions; the ASL's
NextReview, NextReviewMark and NextReviewBackoff states carry their answers.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable

REVIEW_BACKOFF_MAX = 16  # the longest review interval, in review_minutes (8 h at the default 30)


def base_review_s(review_minutes: float, ceiling_s: int) -> int:
    """The first review's interval after a new attempt: ``review_minutes`` (0 = no reviews: the
    outcome wait's longest timeout, ``ceiling_s``), never longer than ``ceiling_s``. At that timeout
    the workflow reviews and, when it stays, waits again: a healthy attempt is never ended for
    training long."""
    return max(1, min(ceiling_s, int(review_minutes * 60))) if review_minutes > 0 else ceiling_s


# a price counts as moved when it crossed a step of this share (its logarithm rounded to steps of it): EC2's
# small ticks would otherwise hold every review at a short interval, and a move weighs gaps of several percent
PRICE_STEP = 0.01
_LOG_STEP = math.log1p(PRICE_STEP)


def _price_step(price: float) -> str:
    """The step of the price on a logarithmic grid of ``PRICE_STEP``: a 2% move always changes it, a move
    of less than 1% only where it crosses a step (a price that is not positive and finite: as written)."""
    return str(round(math.log(price) / _LOG_STEP)) if 0 < price < math.inf else repr(price)


def price_mark(prices: Iterable[tuple[str, float]]) -> str:
    """A short digest of the (pool key, USD per hour) pairs a review read, each price to its step
    (``PRICE_STEP``): equal marks, no price moved by a step (the order of the pairs does not count)."""
    return mark_of(price_entry(key, price) for key, price in prices)


def price_entry(key: str, price: float) -> str:
    """One pool's part of a mark (the simulator keeps each pool's until its price changes)."""
    return f"{key}={_price_step(price)}"


def mark_of(entries: Iterable[str]) -> str:
    """The mark of ``price_entry`` parts, in any order."""
    return hashlib.sha256("\n".join(sorted(entries)).encode()).hexdigest()[:16]


def prices_moved(mark: str | None, last_mark: str | None) -> bool:
    """The prices a review read differ from those the last review read (False when either is unknown:
    the first review of an attempt, or one that read no prices)."""
    return mark is not None and last_mark is not None and mark != last_mark


def kept_mark(mark: str | None, last_mark: str | None) -> str | None:
    """The mark the next review compares with: this review's, or the last one's when it read no prices."""
    return last_mark if mark is None else mark


DUE_SLACK_S = 1.0  # a poll this close to the backoff's due time counts as due (a clock's rounding)


def full_review_due(now: float, due: float | None, mark: str | None, last_mark: str | None) -> bool:
    """A poll scores the pools and decides (a full review): its backoff is due (``due`` None: no full
    review yet this attempt), or the prices it read (``mark``) moved since the last full review's."""
    return due is None or now >= due - DUE_SLACK_S or prices_moved(mark, last_mark)


def poll_s(base_s: int, due: float | None, now: float) -> int:
    """The outcome wait's timeout after a stay: the poll interval ``base_s`` (``base_review_s``), shorter
    only to land on the backoff's ``due`` time (so a backed-off review is as punctual as before)."""
    if due is None or due - now <= DUE_SLACK_S:
        return base_s
    return max(1, min(base_s, math.ceil(due - now)))


def next_review_s(current_s: int | None, base_s: int, ceiling_s: int, changes_in_s: float | None = None,
                  max_factor: int = REVIEW_BACKOFF_MAX, moved: bool = False) -> int:
    """The interval to the next review after one that stayed: twice ``current_s`` (the interval
    that just ended; None or below ``base_s``: ``base_s``), at most ``max_factor`` x ``base_s`` and
    ``ceiling_s`` (the outcome wait's longest timeout), never below ``base_s``. ``changes_in_s``:
    an input of the review changes by then (its spot evidence expires): not later than that, unless
    that is sooner than ``base_s``. ``moved``: the prices changed since the last review
    (``prices_moved``): the market moves at least that often, so the interval is not doubled."""
    if base_s < 1 or max_factor < 1:
        raise ValueError(f"base_s ({base_s}) and max_factor ({max_factor}) must be at least 1")
    floor = min(base_s, ceiling_s)
    current = base_s if current_s is None or current_s < base_s else current_s
    nxt = max(floor, min(current if moved else current * 2, base_s * max_factor, ceiling_s))
    if changes_in_s is not None:
        nxt = min(nxt, max(floor, math.ceil(changes_in_s)))
    return nxt
