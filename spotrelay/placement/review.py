"""The placement review: while a gang trains, is there a clearly better placement now? Pure.

The workflow asks every ``recovery.review_minutes`` (services/review.py). With the current
(pool, gang size) scored like any candidate (``score_pool``, USD per useful hour of the full gang's
work) and the best candidate now (``evaluate_pools`` with gang sizes down to ``min_nodes``)::

    work_rate = useful * throughput * locality * n / N / delay      full-gang work-hours per hour there
    gain      = (score_now - score_best) * work_rate                 USD saved per hour after the move
    horizon   = min(horizon_hours, 1 / gang_interruptions_per_hour(best),
                    the job's own recent spot attempts' mean length, for a spot target)
    move_cost = new_gang_price * (boot_h + restore_h)                the new gang boots while the old
              + old_gang_price * save_h                              trains (make-before-break), then
              + restore transfer                                     restores; the old one's last save;
                                                                      its shards from another region
    move when gain * horizon > move_cost * (1 + margin)

So a move pays for its boot, its restore and the double billing of the overlap within the time it
is expected to last (its first interruption, at most ``horizon_hours``), with a margin on top. The
three cases it covers: leave on-demand for spot, leave an expensive spot pool for a much cheaper
one, and grow a shrunk gang back to ``resources.nodes`` (in the same pool: only the new ranks boot).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from pydantic import BaseModel, ConfigDict, Field

from spotrelay.contracts.recovery import gang_lost
from spotrelay.domain.models import Attempt, Earlier, Pool
from spotrelay.placement import catalog
from spotrelay.placement.gang_fit import SizedScores
from spotrelay.placement.payback import round_trip_cost
from spotrelay.placement.policy import (
    DEFAULT_CONFIG,
    PlacementConfig,
    ScoredPool,
    checkpoint_restore_usd,
    evaluate_pools,
    score_pool,
)
from spotrelay.placement.pool_stats import PoolStats
from spotrelay.placement.spot_evidence import wall_limit
from spotrelay.ports.market import PoolQuote
from spotrelay.spec.models import JobSpec


class ReviewConfig(BaseModel):
    """Assumptions of the move decision (docs/placement.md, "Review")."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    boot_minutes: float = Field(5.0, ge=0, description="launch -> NodeReady, where the caller has no "
                                "per-pool estimate (better_placement's boot_s: the compute's)")
    save_minutes: float = Field(2.0, ge=0, description="the old gang's last save (inside a notice window)")
    horizon_hours: float = Field(24.0, gt=0, description="longest a move is counted on to pay back")
    margin: float = Field(0.5, ge=0, description="the gain must beat the move's cost by this share")


DEFAULT_REVIEW = ReviewConfig()


class Move(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    target: ScoredPool
    current: ScoredPool
    gain_per_hour: float  # USD per hour after the move
    move_cost: float  # USD
    horizon_hours: float
    behind_hours: float | None = None  # a catch-up move (``catch_up``): how far behind its schedule the job was

    @property
    def in_place(self) -> bool:
        """The same pool, a larger gang: the current nodes stay and only the new ranks boot."""
        return self.target.pool == self.current.pool

    @property
    def reason(self) -> str:
        t, c = self.target, self.current
        if self.behind_hours is not None:
            return (f"review: {self.behind_hours:.1f} h behind the schedule of recovery.max_slowdown on "
                    f"{c.pool.key} x{c.nodes}: to {t.pool.key} x{t.nodes} until on schedule again")
        return (f"review: {t.pool.key} x{t.nodes} at {t.score:.2f} USD per useful hour beats {c.pool.key} x{c.nodes}"
                f" at {c.score:.2f}; saves {self.gain_per_hour:.2f}/h over {self.horizon_hours:.1f} h for a"
                f" move of {self.move_cost:.2f}")


EVIDENCE_ATTEMPTS = 6  # the review weighs the job's last this many spot attempts


def _recent_spot(attempts: list[Attempt], last: int, since: float) -> list[Attempt]:
    """The job's last ``last`` closed spot attempts, newest first, stopping at the first that ended
    before ``since``."""
    out: list[Attempt] = []
    for a in reversed(attempts):
        if a.pool is None or a.pool.market != "spot" or a.started_at is None or a.ended_at is None:
            continue
        if a.ended_at < since or len(out) == last:
            break
        out.append(a)
    return out


def spot_attempt_hours(attempts: list[Attempt], last: int = EVIDENCE_ATTEMPTS, now: float | None = None,
                       within_hours: float = 6.0, running_until: float | None = None) -> float | None:
    """Hours a spot gang of this job lasts before a loss ends it, from its last ``last`` closed spot
    attempts: their hours over how many of them a loss ended (an exponential life's estimate when some
    lives are cut short by the job itself, ``Verdict.ended_by_the_job``: a move above all, whose gang
    lived at least that long; counting a move as a short life would make one move hold the job's every
    later move to that short a payback). ``running_until``: the gang running now on spot adds its hours to
    then, without a loss yet (a calm spell after early losses is evidence too). None with fewer than 2
    closed attempts or no loss among them (``gang_lost``: an attempt without an end reason, an older record,
    counts as lost).
    With ``now``, only attempts that ended in the last ``within_hours``: older evidence is stale (a
    market moves), and a gang parked on on-demand would otherwise never look at spot again."""
    since = -math.inf if now is None else now - within_hours * 3600.0
    recent = _recent_spot(attempts, last, since)
    lost = sum(gang_lost(a.end_reason) for a in recent)
    if len(recent) < 2 or lost == 0:
        return None
    seconds = sum(a.ended_at - a.started_at for a in recent if a.ended_at is not None and a.started_at is not None)
    current = attempts[-1] if attempts else None
    if (running_until is not None and current is not None and current.ended_at is None and current.pool is not None
            and current.pool.market == "spot" and current.started_at is not None):
        seconds += max(0.0, running_until - current.started_at)  # the running gang: no loss yet
    return seconds / 3600.0 / lost


def _observed(scored: ScoredPool, gang_rate: float) -> ScoredPool:
    """``scored`` with the gang interrupted ``gang_rate`` times an hour (the job's own spot attempts,
    when they lasted shorter than the pool's learned rate says): useful fraction and score follow."""
    b = scored.breakdown
    useful = 1.0 / (1.0 + gang_rate * b["loss_hours_per_interruption"])
    breakdown = {**b, "gang_interruptions_per_hour": gang_rate, "useful_fraction": useful}
    return scored.model_copy(update={"score": scored.score * b["useful_fraction"] / useful, "breakdown": breakdown})


EVIDENCE_HOURS = 12.0  # a gang parked on on-demand weighs only the spot attempts of this many last hours


def review_spot_hours(attempts: list[Attempt], current_market: str, now: float) -> float | None:
    """The spot evidence a review weighs: the job's last spot attempts and, on spot, the gang running
    now; from on-demand, only those of the last ``EVIDENCE_HOURS`` (else a gang parked there after a
    bad spell never looks at spot again; on spot the evidence stays fresh by itself)."""
    on_spot = current_market == "spot"
    return spot_attempt_hours(attempts, now=None if on_spot else now, within_hours=EVIDENCE_HOURS,
                              running_until=now if on_spot else None)


def evidence_expires_at(attempts: list[Attempt], current_market: str, now: float) -> float | None:
    """When ``review_spot_hours`` next changes with the clock alone: from on-demand, the time the oldest
    spot attempt it counts leaves the ``EVIDENCE_HOURS`` window (None on spot, or with nothing
    counted). The review's backoff never waits past it (placement/cadence.py)."""
    if current_market == "spot":
        return None
    window = EVIDENCE_HOURS * 3600.0
    recent = _recent_spot(attempts, EVIDENCE_ATTEMPTS, now - window)
    return min(a.ended_at for a in recent if a.ended_at is not None) + window if len(recent) >= 2 else None


def work_rate(scored: ScoredPool) -> float:
    """Full-gang work-hours done per wall hour in this placement (the score's denominator)."""
    b = scored.breakdown
    return b["useful_fraction"] * b["throughput"] * b["locality"] * b["gang_share"] / b["delay_factor"]


def better_placement(
    spec: JobSpec, current: PoolQuote, world: int, quotes: list[PoolQuote], stats: Mapping[str, PoolStats],
    now: float, excluded: frozenset[str] = frozenset(), *, config: PlacementConfig = DEFAULT_CONFIG,
    review: ReviewConfig = DEFAULT_REVIEW, spot_hours: float | None = None, sized: SizedScores | None = None,
    stint_hours: float | None = None, boot_s: Callable[[Pool], float] | None = None,
) -> Move | None:
    """The move worth making now, or None (stay). ``current``: the quote of the pool the gang of
    ``world`` ranks runs in. ``spot_hours``: how long this job's recent spot attempts lasted (mean;
    ``spot_attempt_hours``): a spot move is not counted on to last longer than the job's own spot
    attempts did, whatever the pool's prior says. ``boot_s``: seconds from a launch in a pool to
    NodeReady (``Compute.expected_boot_s``, the estimate a move's save deadline uses too; without it
    ``review.boot_minutes``): the new nodes' boot, of the catalog's restore minutes."""
    now_scored = score_pool(spec, current, stats.get(current.pool.key), config, nodes=world, staying=True)
    ranked = evaluate_pools(spec, quotes, stats, now, excluded, config=config, gang_sizes=True, sized=sized).ranked
    best = next((s for s in ranked if not (s.pool == current.pool and s.nodes <= world)), None)
    if best is None:
        return None
    gang_rate = best.breakdown["gang_interruptions_per_hour"]
    if spot_hours is not None and best.pool.market == "spot" and spot_hours > 0:
        best = _observed(best, max(gang_rate, 1.0 / spot_hours))  # the job's own spot gangs lasted this long
        gang_rate = best.breakdown["gang_interruptions_per_hour"]
    if best.score >= now_scored.score:
        return None
    move_cost, restore_h = _move_cost(spec, best, current, world, config, review, boot_s)
    gain = (now_scored.score - best.score) * work_rate(best)
    horizon = min(review.horizon_hours, 1.0 / gang_rate) if gang_rate > 0 else review.horizon_hours
    cost = move_cost
    if current.pool.market != "spot" and best.pool.market == "spot":
        # leaving on-demand: the gang's interruptions are priced in its useful fraction, and a recovery
        # places the next spot gang, so the saving lasts beyond the first one, until the job is back
        # on on-demand: its own stints say when, and each pays a round trip (placement/payback.py)
        horizon = review.horizon_hours
        if stint_hours is not None and spot_hours is None:
            # the gain came from the pool's prior (no recent spot attempts of the job's own): the job's
            # stints say how long it lasts, and the round trip must pay back within that
            horizon = min(horizon, stint_hours)
            od = catalog.instance(current.pool.instance_type)
            back_h = (od.restore_minutes if od else config.default_restore_minutes) / 60
            cost = round_trip_cost(move_cost, world * current.price_per_hour, restore_h, back_h)
    if gain * horizon <= cost * (1.0 + review.margin):
        return None
    return Move(target=best, current=now_scored, gain_per_hour=gain, move_cost=move_cost, horizon_hours=horizon)


def _move_cost(spec: JobSpec, best: ScoredPool, current: PoolQuote, world: int, config: PlacementConfig,
               review: ReviewConfig, boot_s: Callable[[Pool], float] | None) -> tuple[float, float]:
    """(USD, the restore's hours): the new nodes' boot and the gang's restore at the target's price, the
    old gang's last save at its own (make-before-break), and the new ranks' shards read from another
    region when the spec states where its checkpoints are (``checkpoint_restore_usd``)."""
    info = catalog.instance(best.pool.instance_type)
    boot_min = boot_s(best.pool) / 60 if boot_s is not None else review.boot_minutes
    restore_min = max(0.0, (info.restore_minutes if info else config.default_restore_minutes) - boot_min)
    new_nodes = best.nodes - world if best.pool == current.pool else best.nodes
    price = best.quote.price_per_hour
    boot_h, restore_h, save_h = boot_min / 60, restore_min / 60, review.save_minutes / 60
    move_cost = (new_nodes * price * boot_h + best.nodes * price * restore_h
                 + world * current.price_per_hour * save_h
                 + checkpoint_restore_usd(spec, best.pool, new_nodes / best.nodes if best.nodes else 1.0, config))
    return move_cost, restore_h


def catch_up(
    spec: JobSpec, current: PoolQuote, world: int, quotes: list[PoolQuote], stats: Mapping[str, PoolStats],
    now: float, behind_hours: float, excluded: frozenset[str] = frozenset(), *,
    config: PlacementConfig = DEFAULT_CONFIG, review: ReviewConfig = DEFAULT_REVIEW,
    boot_s: Callable[[Pool], float] | None = None,
) -> Move | None:
    """A job ``behind_hours`` behind its ``recovery.max_slowdown`` schedule (spot_evidence.WallLimit) while a
    spot gang or a shrunk one trains (a calm but slow spot type, a gang too small): the best on-demand pool
    at the full gang, whatever the saving, since the schedule is a limit and not a price. None where the
    gang is on on-demand at full size already, or no on-demand pool is allowed."""
    if current.pool.market != "spot" and world >= spec.resources.nodes:
        return None
    on_demand = [q for q in quotes if q.pool.market == "on-demand"]
    best = next(iter(evaluate_pools(spec, on_demand, stats, now, excluded, config=config).ranked), None)
    if best is None:
        return None
    now_scored = score_pool(spec, current, stats.get(current.pool.key), config, nodes=world, staying=True)
    move_cost, _ = _move_cost(spec, best, current, world, config, review, boot_s)
    return Move(target=best, current=now_scored, gain_per_hour=(now_scored.score - best.score) * work_rate(best),
                move_cost=move_cost, horizon_hours=review.horizon_hours, behind_hours=behind_hours)


def keep_to_schedule(
    spec: JobSpec, current: PoolQuote, world: int, quotes: list[PoolQuote], stats: Mapping[str, PoolStats],
    now: float, attempts: list[Attempt], move: Move | None, excluded: frozenset[str] = frozenset(), *,
    config: PlacementConfig = DEFAULT_CONFIG, boot_s: Callable[[Pool], float] | None = None, since: float | None = None,
    earlier: Earlier | None = None,
) -> tuple[Move | None, bool]:
    """``recovery.max_slowdown`` at a full review (services/review.py and the simulator's): past the
    schedule's grace on a spot or shrunk gang, the catch-up move replaces ``move``; and whether the job is
    behind at all, so that the next full review does not back off. Without the limit: (``move``, False).
    ``since`` and ``earlier``: the job's submission, where its schedule starts, and its folded attempts
    (``spot_evidence.wall_limit``)."""
    wall = wall_limit(spec, since, earlier)
    if wall is None:
        return move, False
    standing = wall.standing(attempts, quotes, now, config)
    if standing is None:
        return move, False
    short, late = standing
    if late:
        move = catch_up(spec, current, world, quotes, stats, now, short, excluded, config=config, boot_s=boot_s) or move
    return move, short > 0
