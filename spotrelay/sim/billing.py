"""What a simulated node is billed: cost entries, as the cost ledger (domain/cost.py) reads them.

Spot bills the price in effect while the node runs (per second; AWS bills the Spot price in effect),
not its launch price: one entry per price slot the node lived through (a pools CSV's or the synthetic
market's slots; a trace's price is flat: one entry).
"""

from __future__ import annotations

from collections.abc import Callable

from spotrelay.domain.cost import CostEntry
from spotrelay.domain.models import Pool
from spotrelay.sim.market import SimPool

_ENTRY_FIELDS = frozenset(CostEntry.model_fields)


def cost_entry(attempt: int, pool: Pool, price: float, on_demand: float, start: float, end: float) -> CostEntry:
    """``CostEntry(attempt=attempt, pool=pool, nodes=1, ...)`` without validating: every value is typed
    and in range already (an attempt >= 1, a validated Pool, prices and times the market gave), and a
    stormy run bills ~6,000 entries a job-month (validating them was a twentieth of its CPU)."""
    entry = CostEntry.__new__(CostEntry)
    object.__setattr__(entry, "__dict__", {
        "attempt": attempt, "pool": pool, "nodes": 1, "price_per_hour": price, "on_demand_price_per_hour": on_demand,
        "started_at": start, "ended_at": end})
    object.__setattr__(entry, "__pydantic_fields_set__", _ENTRY_FIELDS)
    object.__setattr__(entry, "__pydantic_extra__", None)
    object.__setattr__(entry, "__pydantic_private__", None)
    return entry


def slot_bills(attempt: int, sp: SimPool, start: float, end: float,
               price_at: Callable[[SimPool, float], float]) -> list[CostEntry]:
    """One node of ``sp`` billed from ``start`` to ``end``: an entry per price slot, each at
    ``price_at(sp, t)`` for the slot's start ``t`` (the run's ``bill_price``; the bound overrides it)."""
    bills, t = [], start
    while True:
        until = min(sp.price_until(t), end)
        until = end if until <= t else until
        bills.append(cost_entry(attempt, sp.pool, price_at(sp, t), sp.on_demand_price, t, until))
        if until >= end:
            return bills
        t = until


def billed_usd(entries: list[CostEntry], now: float) -> float:
    """``CostLedger(entries=tuple(entries)).cost_so_far(now)``, the same float (each entry's cost added
    in order, as ``sum`` adds), with each entry's cost computed once: a gang's nodes share their
    entries (the same objects, ``Run.end_node``), and a long run holds hundreds of thousands."""
    seen: dict[int, float] = {}
    total: float = 0.0
    for e in entries:
        c = seen.get(id(e))
        if c is None:
            c = seen[id(e)] = e.cost(now)
        total += c
    return total
