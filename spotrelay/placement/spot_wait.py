"""Bounded wait for spot (``recovery.spot_wait_minutes``): rather than launch a new gang on
on-demand, or on a spot pool that does much less work per dollar than the best spot pool the spec
allows, Plan waits (unbilled) and asks again, until the job has been without a training gang for
``spot_wait_minutes``; then it launches the best candidate as before. Unset, the wait is
``EVIDENCE_WAIT_MINUTES`` while the job's own spot attempts paid (``placement/spot_evidence.py``).

Price per unit of work = price per node-hour / catalog throughput (``PlacementConfig.throughput``
overrides). The best spot pool is taken ignoring whether it can hold the gang now: that is exactly
the pool worth waiting for. Pure: the clock, the job's attempts and the quotes are given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from spotrelay.domain.models import Job
from spotrelay.placement import catalog
from spotrelay.placement.policy import DEFAULT_CONFIG, PlacementConfig
from spotrelay.placement.spot_evidence import spot_given_up
from spotrelay.ports.market import PoolQuote
from spotrelay.spec.models import JobSpec

# a spot candidate dearer per unit of work than this many times the best spot pool is "not spot's
# saving" (under flat prices p4d spot costs 2.8x p5 spot per unit of work; catalog spot p4d ~1.2x)
SPOT_WAIT_FACTOR = 1.5
# unset recovery.spot_wait_minutes: how long a job whose spot attempts paid waits for spot before on-demand
EVIDENCE_WAIT_MINUTES = 120.0


def work_price(quote: PoolQuote, config: PlacementConfig = DEFAULT_CONFIG) -> float:
    """USD per node-hour over the instance type's throughput (relative to one p4d.24xlarge)."""
    info = catalog.instance(quote.pool.instance_type)
    throughput = config.throughput.get(quote.pool.instance_type) or (info.throughput if info else 1.0)
    return quote.price_per_hour / throughput


def stopped_at(job: Job) -> float | None:
    """When the job last had a training gang: the last attempt's end, or its creation before the
    first attempt; None while an attempt is still open (a gang trains: never wait then)."""
    if not job.attempts:
        return job.created_at
    return job.attempts[-1].ended_at


def _bounds(quotes: list[PoolQuote], config: PlacementConfig) -> tuple[float, float]:
    """(the best spot pool's, the best on-demand pool's) price per unit of work; inf when none."""
    spot = [work_price(q, config) for q in quotes if q.pool.market == "spot"]
    on_demand = [work_price(q, config) for q in quotes if q.pool.market == "on-demand"]
    return min(spot, default=math.inf), min(on_demand, default=math.inf)


def _saving(quote: PoolQuote, bounds: tuple[float, float], config: PlacementConfig) -> bool:
    price = work_price(quote, config)
    return quote.pool.market == "spot" and price <= SPOT_WAIT_FACTOR * bounds[0] and price < bounds[1]


def saves(quote: PoolQuote, quotes: list[PoolQuote], config: PlacementConfig = DEFAULT_CONFIG) -> bool:
    """A spot pool within ``SPOT_WAIT_FACTOR`` of the best spot pool's price per unit of work, and
    cheaper per unit of work than every on-demand pool quoted (spot dearer than on-demand is no saving).
    Asking about many quotes: ``plan_view(...).saves`` (the bounds once, not once per quote)."""
    return _saving(quote, _bounds(quotes, config), config)


@dataclass(frozen=True)
class PlanView:
    """What one Plan weighs for the wait, computed once per Plan: the best spot and on-demand prices
    per unit of work among its quotes, and the job's spot verdict (``spot_evidence.spot_given_up``)."""

    bounds: tuple[float, float]
    did_not_pay: bool
    config: PlacementConfig = DEFAULT_CONFIG

    def saves(self, quote: PoolQuote) -> bool:
        """``saves(quote, quotes)`` against this Plan's quotes."""
        return _saving(quote, self.bounds, self.config)


def plan_view(spec: JobSpec, job: Job, quotes: list[PoolQuote], now: float, config: PlacementConfig = DEFAULT_CONFIG,
              did_not_pay: bool | None = None) -> PlanView:
    """The Plan's view of ``quotes``, with Plan's spot verdict (``spot_evidence.spot_given_up``, which
    reads only the on-demand quotes); ``did_not_pay``: that verdict, when the caller has it already."""
    if did_not_pay is None:
        did_not_pay = spot_given_up(spec, job.attempts, job.stalled_recoveries, quotes, now, config,
                                    job.created_at, job.earlier)
    return PlanView(_bounds(quotes, config), did_not_pay, config)


def wait_minutes(spec: JobSpec, job: Job, quotes: list[PoolQuote], now: float,
                 config: PlacementConfig = DEFAULT_CONFIG, did_not_pay: bool | None = None) -> float:
    """The wait the spec states; unset: ``EVIDENCE_WAIT_MINUTES`` unless Plan has given spot up (the job's
    own spot attempts cost more per useful step than on-demand would have, or stalled: ``spot_evidence
    .spot_given_up``; ``did_not_pay``: that verdict, when the caller has it already): then waiting would
    only add wall time to a loss."""
    stated = spec.recovery.spot_wait_minutes
    if stated is not None:
        return stated
    if did_not_pay is None:
        did_not_pay = spot_given_up(spec, job.attempts, job.stalled_recoveries, quotes, now, config,
                                    job.created_at, job.earlier)
    return 0.0 if did_not_pay else EVIDENCE_WAIT_MINUTES


def wait_left_s(spec: JobSpec, job: Job, quotes: list[PoolQuote], now: float, view: PlanView,
                time_scale: float = 1.0) -> float:
    """Seconds the job may still wait for spot (> 0: Plan offers only pools that ``saves``); 0 when
    there is no wait (``wait_minutes``), a gang trains, no allowed spot pool is cheaper per unit of work
    than on-demand, or the job waited long enough. ``view``: this Plan's ``plan_view`` of ``quotes``.
    ``time_scale``: clock seconds per second of the wait (``WorkflowTimings.time_scale``: 1 on AWS, the
    twin's boot scale there)."""
    since = stopped_at(job)
    if since is None:
        return 0.0
    if not any(view.saves(q) for q in quotes):  # no allowed spot pool is a saving
        return 0.0
    limit_s = wait_minutes(spec, job, quotes, now, view.config, view.did_not_pay) * 60.0 * time_scale
    if limit_s <= 0:
        return 0.0
    return max(0.0, since + limit_s - now)


def spot_wait_s(spec: JobSpec, job: Job, best: PoolQuote, quotes: list[PoolQuote], now: float,
                recheck_s: int, view: PlanView, time_scale: float = 1.0) -> int:
    """Seconds Plan should wait instead of launching on ``best`` (the best candidate that is left);
    0: launch now. At most ``recheck_s`` at a time (ask the market again), never past the job's
    ``spot_wait_minutes`` without a gang (at ``time_scale``, as ``wait_left_s``). ``view``: this Plan's
    ``plan_view`` of ``quotes``."""
    left = wait_left_s(spec, job, quotes, now, view, time_scale)
    if left <= 0 or view.saves(best):
        return 0
    return max(1, math.ceil(min(recheck_s, left)))
