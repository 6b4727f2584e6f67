"""The cost ledger: what each launch costs, what the job has spent, what on-demand would have cost.

Pure: callers pass ``now``. One ``CostEntry`` per gang launch (a whole cluster, or the replacement
ranks of a ``replace-lost-nodes`` recovery); an attempt's cost is the sum of the entries with its
number that are billed during it. Prices are USD per instance-hour at launch while an attempt runs;
its close counts it at the price in effect over its life (``mean_price`` of the spot price history: AWS
bills the price in effect, and a placer that launches where spot is cheap now sees it rise more often
than fall). AWS billing is the truth. EC2 bills P instances per second.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from pydantic import BaseModel, ConfigDict, Field

from spotrelay.domain.models import Attempt, Pool
from spotrelay.errors import BudgetExceededError


def attempt_cost(price_per_hour: float, nodes: int, started_at: float, ended_at: float) -> float:
    """USD for ``nodes`` instances at ``price_per_hour`` from ``started_at`` to ``ended_at`` (epoch s)."""
    if price_per_hour < 0 or nodes < 0:
        raise ValueError("price and node count cannot be negative")
    return price_per_hour * nodes * max(0.0, ended_at - started_at) / 3600.0


# EC2 User Guide, "Billing for interrupted Spot Instances": a Linux Spot Instance that Amazon EC2
# interrupts within its first instance hour is not charged at all; one we stop or terminate ourselves
# is billed per second. So a noticed instance in its first hour is left for EC2 to take.
SPOT_FREE_INTERRUPTION_S = 3600.0
# EC2 takes a noticed instance "in two minutes", not to the second, and counts the hour from when it
# ran (after our launch call): an instance is left to EC2 only when its reclaim is this far inside the hour
LEAVE_TO_EC2_MARGIN_S = 60.0


def interruption_is_free(market: str, launched_at: float, interrupted_at: float) -> bool:
    """Whether EC2's interruption of an instance launched at ``launched_at`` costs nothing (a spot
    instance EC2 takes within its first hour). A reclaim before the launch is bad data: billed."""
    return market == "spot" and 0.0 <= interrupted_at - launched_at < SPOT_FREE_INTERRUPTION_S


def leave_to_ec2(market: str, launched_at: float, ec2_reclaim_at: float | None) -> bool:
    """Whether an instance we no longer need should be left for EC2's announced reclaim instead of
    terminated: terminating it bills its whole first hour so far; EC2's interruption bills none of it.
    Past the first hour terminating saves the seconds to the reclaim, so it is terminated."""
    return ec2_reclaim_at is not None and market == "spot" and (
        0.0 <= ec2_reclaim_at - launched_at < SPOT_FREE_INTERRUPTION_S - LEAVE_TO_EC2_MARGIN_S)


def unbilled_node_seconds(attempt: Attempt, now: float, noticed: Iterable[tuple[float, float]]) -> float:
    """Node-seconds of ``attempt``'s cost (start to ``now``) that EC2 will not bill: its instances EC2
    noticed, as (launched_at, EC2's reclaim), that spotrelay leaves to EC2 (``leave_to_ec2``: the
    reclaim well inside their first hour), so none of their first hour is billed. One whose reclaim is
    in the hour's last minute is terminated by us when released, and billed: it is counted."""
    if attempt.pool is None or attempt.started_at is None:
        return 0.0
    return sum(max(0.0, now - max(attempt.started_at, launched)) for launched, reclaim in noticed
               if leave_to_ec2(attempt.pool.market, launched, reclaim))


def mean_price(history: Iterable[tuple[float, float]], start: float, end: float, fallback: float) -> float:
    """The time-weighted mean from ``start`` to ``end`` of a price that changes at each (epoch s, USD per
    hour) of ``history`` and holds until the next change (DescribeSpotPriceHistory's entries; it answers
    with the change in effect at its start time too). ``fallback`` (the launch price) where the history
    says nothing: before its first change, or throughout when it is empty. At one instant (``end <=
    start``): the price in effect then. Entries that are not a price (negative, NaN, infinite) are skipped."""
    points = sorted((t, p) for t, p in history if math.isfinite(t) and math.isfinite(p) and p >= 0.0)
    price = fallback
    for t, p in points:  # the price in effect at the start
        if t > start:
            break
        price = p
    if end <= start:
        return price
    total, t0 = 0.0, start
    for t, p in points:
        if t <= start:
            continue
        if t >= end:
            break
        total += price * (t - t0)
        t0, price = t, p
    if t0 == start:
        return price  # (no change inside: that price exactly, not its float average)
    return (total + price * (end - t0)) / (end - start)


def closed_attempt(attempt: Attempt, now: float, reason: str | None = None,
                   noticed: Iterable[tuple[float, float]] = (), price: float | None = None) -> Attempt:
    """``attempt`` with its clock stopped at ``now``: ``ended_at``, ``end_reason`` and its cost (its
    price x nodes from its start, 0 if it never started, less what EC2 will not bill of its ``noticed``
    instances: ``unbilled_node_seconds``). ``price``: USD per instance-hour in effect over its life
    (``mean_price`` of the pool's history), kept as ``price_in_effect``; None: the price last read while
    it ran (a budget's hourly read), else its launch price. The
    services and the simulator close attempts with it; a caller adds the cost to the job's total once
    (an open attempt only)."""
    start = attempt.started_at if attempt.started_at is not None else now
    rate = attempt.billed_price() if price is None else price  # (no history now: the last one read, if any)
    clock = cost = attempt_cost(rate, attempt.nodes, start, now)
    free = unbilled_node_seconds(attempt, now, noticed)
    if free:
        cost = max(0.0, cost - rate * free / 3600.0)
    return attempt.model_copy(update={"ended_at": now, "end_reason": reason, "cost": cost, "unbilled": clock - cost,
                                      "price_in_effect": attempt.price_in_effect if price is None else price})


# How often a running spot attempt's price in effect is read (the reconcile sweep, every job): the budget's
# stop and the cost report count the open attempt at it. Spot prices move on hours, and a call per sweep (every
# minute) per job would spend DescribeSpotPriceHistory's rate limit on nothing.
PRICE_REFRESH_S = 3600.0


def open_spot(attempt: Attempt | None) -> bool:
    """Whether ``attempt`` is a started spot attempt still open: the one whose price in effect moves."""
    return (attempt is not None and attempt.ended_at is None and attempt.started_at is not None
            and attempt.pool is not None and attempt.pool.market == "spot")


def price_read_at(attempt: Attempt | None) -> float | None:
    """When the open spot ``attempt``'s price in effect is next read (``PRICE_REFRESH_S`` after its
    start, then after the last read); None for any other attempt."""
    if attempt is None or not open_spot(attempt):
        return None
    assert attempt.started_at is not None  # (open_spot)
    last = attempt.price_checked_at if attempt.price_checked_at is not None else attempt.started_at
    return last + PRICE_REFRESH_S


def price_due(attempt: Attempt | None, now: float) -> bool:
    """Whether the open spot ``attempt``'s price in effect is to be read now (``price_read_at``)."""
    at = price_read_at(attempt)
    return at is not None and now >= at


def outlived_cost(closed: Attempt, launched_at: float, now: float) -> float:
    """USD one instance of ``closed`` was billed past the attempt's close, to ``now``: a rank left to
    finish a notice's or a move's save, released at its exit, or a survivor kept while its replacements
    were placed, until it joins the next attempt. 0 while the attempt's own clock runs (open)."""
    if closed.ended_at is None:
        return 0.0
    return attempt_cost(closed.billed_price(), 1, max(closed.ended_at, launched_at), now)


def outlived_so_far(attempts: Sequence[Attempt], running: Iterable[tuple[int, float]], now: float) -> dict[int, float]:
    """Per attempt number: what the instances in ``running`` ((attempt number, launched_at), each still
    billed) have cost past their attempt's close by ``now``; their release will charge it to
    ``drain_cost`` (``charge_outlived``). What a report shows before then."""
    by_number = {a.number: a for a in attempts}
    out: dict[int, float] = {}
    for number, launched_at in running:
        closed = by_number.get(number)
        if closed is not None and closed.ended_at is not None:
            out[number] = out.get(number, 0.0) + outlived_cost(closed, launched_at, now)
    return out


def charge_outlived(attempts: Sequence[Attempt], outlived: Iterable[tuple[int, float]],
                    now: float) -> tuple[list[Attempt], float]:
    """``attempts`` with what the instances in ``outlived`` ((attempt number, launched_at), one per
    instance, once: the caller marks them released or carried) cost past their attempt's close added to
    its ``drain_cost``, and that sum (for the job's ``cost_so_far``). The ledger's close stops an
    attempt's clock when the workflow moves on; AWS bills each instance until it is terminated."""
    extra = outlived_so_far(attempts, outlived, now)
    charged = [a.model_copy(update={"drain_cost": a.drain_cost + extra[a.number]}) if extra.get(a.number) else a
               for a in attempts]
    return charged, sum(extra.values())


def drains(attempts: Sequence[Attempt], running: Iterable[tuple[int, float]], now: float) -> tuple[float, float]:
    """(USD, USD per second) of the instances in ``running`` ((attempt number, launched_at), each still
    billed) whose attempt is closed: ranks still finishing their final save. What they cost past the
    close by ``now``, and how fast that grows: the budget counts it before their release charges it."""
    by_number = {a.number: a for a in attempts}
    accrued = rate = 0.0
    for number, launched_at in running:
        closed = by_number.get(number)
        if closed is not None and closed.ended_at is not None:
            accrued += outlived_cost(closed, launched_at, now)
            rate += closed.billed_price() / 3600.0
    return accrued, rate


class CostEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    attempt: int = Field(..., ge=1)
    pool: Pool
    nodes: int = Field(..., ge=1)
    price_per_hour: float = Field(..., ge=0)
    on_demand_price_per_hour: float = Field(..., ge=0, description="same type, same region, on-demand")
    started_at: float
    ended_at: float | None = None  # None while the instances run

    def hours(self, now: float) -> float:
        end = self.ended_at if self.ended_at is not None else now
        return max(0.0, end - self.started_at) / 3600.0

    def cost(self, now: float) -> float:
        return attempt_cost(self.price_per_hour, self.nodes, self.started_at, self.started_at + self.hours(now) * 3600)

    def on_demand_cost(self, now: float) -> float:
        return self.on_demand_price_per_hour * self.nodes * self.hours(now)


class CostLedger(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    entries: tuple[CostEntry, ...] = ()

    def opened(self, entry: CostEntry) -> CostLedger:
        return self.model_copy(update={"entries": (*self.entries, entry)})

    def closed(self, ended_at: float, attempt: int | None = None) -> CostLedger:
        """Stop the clock of the open entries (of ``attempt``, or all)."""
        entries = tuple(
            e.model_copy(update={"ended_at": ended_at})
            if e.ended_at is None and (attempt is None or e.attempt == attempt) else e
            for e in self.entries
        )
        return self.model_copy(update={"entries": entries})

    def attempt_cost(self, attempt: int, now: float) -> float:
        return sum(e.cost(now) for e in self.entries if e.attempt == attempt)

    def cost_so_far(self, now: float) -> float:
        return sum(e.cost(now) for e in self.entries)

    def on_demand_equivalent(self, now: float) -> float:
        return sum(e.on_demand_cost(now) for e in self.entries)

    def savings(self, now: float) -> tuple[float, float]:
        """(USD saved vs on-demand, fraction saved 0..1)."""
        od, spent = self.on_demand_equivalent(now), self.cost_so_far(now)
        return od - spent, (od - spent) / od if od > 0 else 0.0

    def summary(self, now: float) -> str:
        saved, fraction = self.savings(now)
        return (f"cost so far ${self.cost_so_far(now):,.2f} (on-demand ${self.on_demand_equivalent(now):,.2f}, "
                f"saved ${saved:,.2f} = {fraction:.0%})")

    def check_budget(self, max_total_cost: float | None, now: float) -> None:
        check_budget(self.cost_so_far(now), max_total_cost)


def check_budget(spent: float, max_total_cost: float | None) -> None:
    """``BudgetExceededError`` once ``spent`` reaches the spec's ``budget.max_total_cost``."""
    reason = over_budget(spent, max_total_cost)
    if reason is not None:
        raise BudgetExceededError(reason)


def over_budget(spent: float, max_total_cost: float | None) -> str | None:
    """Why the job stops (``spent`` reached the spec's ``budget.max_total_cost``), else None. Plan refuses
    a new gang and the reconcile sweep fails a running one with it; the simulator asks the same."""
    if max_total_cost is None or spent < max_total_cost:
        return None
    return f"spent ${spent:,.2f} of the ${max_total_cost:,.2f} budget"


# The reconcile stops a job this far ahead of its budget, so that what the stop still spends fits in it:
# the sweep that sees the crossing may come a whole period late, then the ranks save (their minutes are
# billed). The save is the job's newest measured one (a periodic save writes what a stop's save writes)
# with headroom for S3's variance; before any, the notice window every spot save must fit in.
DEFAULT_SAVE_S = 120.0
SAVE_HEADROOM = 1.5
SWEEP_S = 60.0  # the reconcile schedule's default period (cdk/config.py: reconcile_minutes = 1)


def stop_lead_s(sweep_s: float, save_s: float | None) -> float:
    """Seconds before the ledger reaches the budget at which the reconcile sweep stops the job."""
    save = DEFAULT_SAVE_S if save_s is None or save_s <= 0 else SAVE_HEADROOM * save_s
    return max(0.0, sweep_s) + save


def budget_stop(cost_so_far: float, current: Attempt | None, now: float, max_total_cost: float | None,
                lead_s: float, draining: tuple[float, float] = (0.0, 0.0)) -> str | None:
    """Why the reconcile sweep stops a running job now, else None: the ledger ``lead_s`` from now
    (``stop_lead_s``: the next sweep and the ranks' save) reaches the budget, so the job ends within it.
    ``draining``: ``drains``' (USD so far, USD per second) of a closed attempt's ranks still saving."""
    if max_total_cost is None:
        return None
    spent = spent_with_drains(spent_at(cost_so_far, current, now), draining, 0.0)
    if spent >= max_total_cost:
        return over_budget(spent, max_total_cost)
    ahead = spent_with_drains(spent_at(cost_so_far, current, now + lead_s), draining, lead_s)
    if ahead < max_total_cost:
        return None
    return (f"spent ${spent:,.2f} of the ${max_total_cost:,.2f} budget; the ranks' save and the next sweep "
            f"({lead_s / 60:.1f} min at the running attempt's rate) would spend the rest")


def spent_with_drains(cost_so_far: float, draining: tuple[float, float], lead_s: float) -> float:
    """The closed attempts' cost and the ranks still draining (``drains``) billed for ``lead_s`` more:
    what Plan counts as spent before a launch (those ranks run on while the new gang boots)."""
    accrued, rate = draining
    return cost_so_far + accrued + rate * lead_s


def budget_warning(spent: float, max_total_cost: float | None, warn_at: float | None) -> str | None:
    """What to tell people once ``spent`` reached ``warn_at`` of the budget (and not the budget itself:
    then the job stops, with ``over_budget``'s reason), else None."""
    if max_total_cost is None or warn_at is None or not warn_at * max_total_cost <= spent < max_total_cost:
        return None
    return (f"spent ${spent:,.2f} of the ${max_total_cost:,.2f} budget ({spent / max_total_cost:.0%}); "
            f"the job stops at ${max_total_cost:,.2f}")


def spent_at(cost_so_far: float, current: Attempt | None, now: float) -> float:
    """What the job record says the job has spent at ``now``: its closed attempts (``cost_so_far``) and
    the clock of the one still open (an estimate: at its price in effect as last read, ``price_due``,
    else at its launch price)."""
    if current is None or current.ended_at is not None:
        return cost_so_far
    return cost_so_far + attempt_cost(current.billed_price(), current.nodes,
                                       current.started_at if current.started_at is not None else now, now)


def budget_reached_at(cost_so_far: float, current: Attempt | None, max_total_cost: float) -> float | None:
    """The moment the open attempt's clock brings ``spent_at`` to ``max_total_cost`` (its start when the
    closed attempts reached it already); None without an open attempt, or one that costs nothing."""
    if current is None or current.ended_at is not None or current.started_at is None:
        return None
    if cost_so_far >= max_total_cost:
        return current.started_at
    rate = current.billed_price() * current.nodes / 3600.0  # USD per second
    return None if rate <= 0 else current.started_at + (max_total_cost - cost_so_far) / rate
