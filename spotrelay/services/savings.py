"""What a job's instance-hours would have cost on on-demand: spot savings as AWS counts them (the same
usage at the on-demand price of each attempt's type in its region, the catalog's). It compares the hours
the job ran, interruptions included; the simulator's cost per useful GPU-hour counts those against spot."""

from __future__ import annotations

from collections.abc import Iterable

from spotrelay.domain.models import Attempt
from spotrelay.placement import catalog


def on_demand_cost(attempt: Attempt, cost: float) -> float | None:
    """What the instance-hours ``cost`` paid for (at the price it was counted at: ``Attempt.billed_price``)
    would cost on on-demand; None when no on-demand price is known for them (a comparison, never a guess)."""
    if cost <= 0.0:
        return 0.0
    if attempt.pool is None or attempt.billed_price() <= 0.0:
        return None
    if attempt.pool.market == "on-demand":
        return cost
    price = catalog.on_demand_price(attempt.pool.region, attempt.pool.instance_type)
    return None if price is None else cost / attempt.billed_price() * price


def total(costs: Iterable[float | None]) -> float | None:
    """The sum of every attempt's on-demand cost; None when one is unknown."""
    known = list(costs)
    return None if None in known else sum(c for c in known if c is not None)


def saved_share(spent: float, on_demand: float | None) -> float | None:
    """1 - spent / on_demand (None without a comparison)."""
    return round(1.0 - spent / on_demand, 4) if on_demand else None


def finished_job(attempts: Iterable[Attempt]) -> tuple[float, float | None]:
    """(what a closed job's attempts cost, each with what its instances were billed past its close; the
    same instance-hours on on-demand). A prewarmed standby's cost is in the job's total but in no
    attempt: the share saved compares the attempts' hours alone, like with like."""
    paid = [a.cost + a.drain_cost for a in attempts]
    return sum(paid), total(on_demand_cost(a, cost) for a, cost in zip(attempts, paid, strict=True))
