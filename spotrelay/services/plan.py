"""The job-run workflow's Plan task: where provision launches which ranks (a keeping recovery as
decided by recover, or a new gang ranked over (pool, size) pairs). Safe to run twice.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Protocol, TypeVar

from spotrelay.contracts.recovery import Candidate, LaunchPlan, RecoveryPlan
from spotrelay.domain.advice import notice_risk_share
from spotrelay.domain.cost import SWEEP_S, attempt_cost, over_budget, spent_with_drains
from spotrelay.domain.models import Job, Node, NodeState, Pool
from spotrelay.domain.status import JobStatus, transition
from spotrelay.errors import BudgetExceededError, JobCancelledError, NoPlacementError
from spotrelay.placement import best_pool, rank_pools
from spotrelay.placement.gang_fit import SizedScores, probe_sizes, scores_of
from spotrelay.placement.policy import GANG_FIT_REASON, evaluate_pools, loss_interval, score_pool
from spotrelay.placement.pool_stats import PoolStats
from spotrelay.placement.spot_wait import PlanView, plan_view, spot_wait_s, stopped_at, wait_left_s
from spotrelay.ports.market import PoolQuote
from spotrelay.services.budget import draining, lead_s
from spotrelay.services.controller import Controller, release_nodes, spec_of
from spotrelay.spec.models import JobSpec


class _HasPool(Protocol):
    @property
    def pool(self) -> Pool: ...


_Keyed = TypeVar("_Keyed", bound=_HasPool)

log = logging.getLogger(__name__)
MAX_CANDIDATES = 8  # pools provision may try before backing off and re-planning
GANG_FIT_RECHECK_S = 300  # no pool holds the gang now: plan again this much later (new placement scores)


def _placing_deadline(spec: JobSpec, job: Job, time_scale: float) -> tuple[float, float] | None:
    """(since when the job has had no training gang, the moment ``recovery.max_placing_minutes`` runs
    out, at ``time_scale`` like the spot wait), or None: no bound, or a gang trains."""
    limit, since = spec.recovery.max_placing_minutes, stopped_at(job)
    if limit is None or since is None:
        return None
    return since, since + limit * 60.0 * time_scale


def placing_overdue(spec: JobSpec, job: Job, now: float, time_scale: float = 1.0) -> str | None:
    """Why the job must stop waiting for a gang (``recovery.max_placing_minutes`` without one since its
    submission or its last attempt's end), else None. Without a bound a job whose pools never have
    capacity would sit in PLACING until it is cancelled."""
    bound = _placing_deadline(spec, job, time_scale)
    if bound is None or now < bound[1]:
        return None
    return (f"job {job.job_id} has had no training gang for {(now - bound[0]) / 60.0 / time_scale:.0f} minutes "
            f"(recovery.max_placing_minutes {spec.recovery.max_placing_minutes:g}): no allowed pool took it in time")


def within_bound(spec: JobSpec, job: Job, launch: LaunchPlan, now: float, time_scale: float = 1.0) -> LaunchPlan:
    """``launch``, its wait (for spot, for a pool's cooldown) cut to end at the job's
    ``recovery.max_placing_minutes``: the Plan after it fails the job then, not hours later."""
    bound = _placing_deadline(spec, job, time_scale) if launch.wait_s else None
    if bound is None:
        return launch
    left = max(1, math.ceil(bound[1] - now))
    return launch if launch.wait_s <= left else launch.model_copy(update={"wait_s": left})


def live(job: Job) -> Job:
    """The job, unless it is being cancelled (every workflow task stops there)."""
    if job.status is JobStatus.CANCELLING:
        raise JobCancelledError(f"job {job.job_id} is being cancelled")
    return job


def affordable(spec: JobSpec, job: Job, spent: float, launch: LaunchPlan, boot_s: Callable[[Pool], float],
               lead_s: float) -> LaunchPlan:
    """``launch``'s candidates whose gang the budget left can pay to boot and then save (the reconcile
    stops a job ``lead_s`` ahead of its budget: ``budget_stop``). Near the end of a budget a gang it
    cannot pay would be stopped by the first sweep after its boot, having trained nothing: none left
    is ``BudgetExceededError`` now, within the budget. ``spent``: the closed attempts' cost and the ranks
    of one still draining its save (``spent_with_drains``)."""
    limit = spec.budget.max_total_cost
    if limit is None or not launch.candidates:
        return launch
    left = limit - spent

    def cost(c: Candidate) -> float:
        return attempt_cost(c.price_per_hour, c.nodes or spec.resources.nodes, 0.0, boot_s(c.pool) + lead_s)

    kept = [c for c in launch.candidates if cost(c) < left]
    if not kept:
        cheapest = min(launch.candidates, key=cost)
        raise BudgetExceededError(
            f"job {job.job_id}: the ${left:,.2f} left of the ${limit:,.2f} budget would not pay for a gang to boot "
            f"and save (${cost(cheapest):,.2f} in {cheapest.pool.key})")
    return launch if len(kept) == len(launch.candidates) else launch.model_copy(update={"candidates": kept})


def plan(ctl: Controller, job_id: str, now: float, recovery: RecoveryPlan | None = None,
         time_scale: float = 1.0, sweep_s: float = SWEEP_S) -> LaunchPlan:
    """Move the job to PLACING and say where provision launches which ranks.

    A keeping ``recovery`` (replace-lost / restart-in-place, decided by recover) is executed as is:
    its survivors' pool is the only candidate, priced but not re-ranked (a pool's cooldown governs
    new gangs; it does not evict survivors running there). Only a launch that failed in that pool
    since (provision excluded it) releases the survivors for a whole new gang. ``time_scale``: clock
    seconds per second of Plan's own waits (``WorkflowTimings.time_scale``; the twin runs them faster).
    ``sweep_s``: the reconcile schedule's period (a budget's stop comes a sweep and a save ahead of it).
    """
    recovery = recovery or RecoveryPlan()
    job = live(ctl.store.get_job(job_id))
    spec = spec_of(job)
    spent = over_budget(job.cost_so_far, spec.budget.max_total_cost)
    if spent is not None:
        raise BudgetExceededError(f"job {job_id} {spent}")
    overdue = placing_overdue(spec, job, now, time_scale)
    if overdue:
        raise NoPlacementError(overdue)
    assert ctl.market is not None and ctl.pool_stats is not None
    res = spec.resources
    quotes = ctl.market.quotes(res.regions, res.instance_types, [m.value for m in res.markets],
                                  capacity=res.nodes + res.spares)  # the placement score is sized for the launch
    stats = ctl.pool_stats.get_many([q.pool.key for q in quotes])
    launch = _keeping_plan(spec, recovery, job, quotes, stats) if recovery.keeps else None
    if launch is None:
        if recovery.keep_instance_ids:  # the survivors' pool refused the replacements: they go too
            kept = set(recovery.keep_instance_ids) | {p.instance_id for p in recovery.promoted}
            drop_survivors(ctl, job, [n for n in ctl.store.nodes_of(job_id) if n.instance_id in kept],
                           recovery.deadline, now)
        sized = {m: scores_of(ctl.market.quotes(res.regions, res.instance_types, [mk.value for mk in res.markets],
                                                 capacity=m)) for m in probe_sizes(spec)}  # elastic sizes
        launch = _new_gang_plan(spec, job, quotes, stats, now, sized, time_scale=time_scale)
    launch = within_bound(spec, job, launch, now, time_scale)
    if spec.budget.max_total_cost is not None:
        lead = lead_s(job, sweep_s)
        launch = affordable(spec, job, spent_with_drains(job.cost_so_far, draining(ctl, job, now), lead), launch,
                            lambda pool: ctl.need_compute().expected_boot_s(pool), lead)

    def to_placing(current: Job) -> Job | None:
        live(current)
        if current.status is JobStatus.PLACING:
            return None
        return current.model_copy(update={"status": transition(current.status, JobStatus.PLACING),
                                          "updated_at": now})

    ctl.store.update_job(job_id, to_placing)
    log.info("placement", extra={"job_id": job_id, "candidates": [c.pool.key for c in launch.candidates],
                                 "launch_ranks": launch.launch_ranks, "keep": launch.keep_instance_ids})
    return launch


def drop_survivors(ctl: Controller, job: Job, nodes: list[Node], deadline: float | None, now: float) -> None:
    """Release survivors plan no longer keeps. Those that may still be writing the emergency
    checkpoint (a notice's or a move's, until ``deadline``) drain like doomed ranks: the agent event
    of their exit, or reconcile after the deadline, releases them; the rest go now."""
    saving = (NodeState.READY, NodeState.RUNNING, NodeState.DOOMED)
    if deadline is not None and deadline > now:
        for node in [n for n in nodes if n.state in saving]:
            ctl.store.update_node(job.job_id, node.node_id, lambda n: n.model_copy(
                update={"release_after": deadline}) if n.state in saving and n.release_after is None else None)
        nodes = [n for n in nodes if n.state not in saving]
    release_nodes(ctl, job, nodes, now)


def _keeping_plan(spec: JobSpec, recovery: RecoveryPlan, job: Job, quotes: list[PoolQuote],
                  stats: dict[str, PoolStats]) -> LaunchPlan | None:
    home = recovery.pool
    assert home is not None
    quote = next((q for q in quotes if q.pool == home), None)
    if home.key in job.excluded_pools or quote is None:
        return None
    world = len(recovery.keep_instance_ids) + len(recovery.promoted) + len(recovery.launch_ranks)
    scored = score_pool(spec, quote, stats.get(home.key), nodes=world)
    interval = loss_interval(scored, at_risk=notice_risk_share(job.attempts))
    return LaunchPlan(candidates=[Candidate(pool=home, price_per_hour=quote.price_per_hour,
                                            score=round(scored.score, 4), nodes=world, loss_interval_s=interval)],
                      launch_ranks=list(recovery.launch_ranks), keep_instance_ids=list(recovery.keep_instance_ids),
                      promoted=list(recovery.promoted), world_size=world)


def _new_gang_plan(spec: JobSpec, job: Job, quotes: list[PoolQuote], stats: dict[str, PoolStats],
                   now: float, sized: SizedScores | None = None, view: PlanView | None = None,
                   time_scale: float = 1.0) -> LaunchPlan:
    """Rank (pool, gang size) pairs for a new gang (down to ``resources.min_nodes``; a smaller gang
    wins when it scores cheaper per useful hour, or when no pool is left for the full one). A pool
    that refused a gang this run is excluded at that size and larger (``pool@n``); once every pair
    is excluded, those whose cooldown passed are tried again. ``view``: ``plan_view`` of every quote the
    market gave (the wait's bounds and the job's spot verdict) when the caller has it; else computed
    once here from ``quotes``. The wait for spot and the re-checks run at ``time_scale`` (cooldown
    ends are already on the clock)."""
    recheck_s = max(1, math.ceil(GANG_FIT_RECHECK_S * time_scale))
    excluded = frozenset(job.excluded_pools)
    ranked = rank_pools(spec, quotes, stats, now, excluded, gang_sizes=True, sized=sized)
    if not ranked and excluded:  # every pool failed this run: retry those whose cooldown has passed
        excluded = frozenset()
        ranked = rank_pools(spec, quotes, stats, now, excluded, gang_sizes=True, sized=sized)
    if not ranked:
        wait = _first_cooldown_end(spec, quotes, stats, now)
        if _gang_does_not_fit(spec, quotes, stats, now, excluded, sized):  # spot pools too full for the gang now
            wait = min(wait or recheck_s, recheck_s)
        if wait is not None:  # every allowed pool cools down: wait for the first to come back
            return LaunchPlan(candidates=[], launch_ranks=list(range(spec.resources.nodes)), wait_s=wait)
        best_pool(spec, quotes, stats, now, excluded)  # raises NoPlacementError with the reasons
        raise NoPlacementError(f"no candidate pool for job {job.job_id}")
    view = view or plan_view(spec, job, quotes, now)  # the bounds and the verdict, once per Plan
    given_up = view.did_not_pay and any(c.pool.market != "spot" for c in ranked)
    if given_up:  # its own spot attempts cost more per step, or the stall budget has one gang left:
        ranked = [c for c in ranked if c.pool.market != "spot"]  # no spot, and so no wait for spot
    elif wait_left_s(spec, job, quotes, now, view, time_scale) > 0:  # spot_wait_minutes: spot's saving
        saving = [c for c in ranked if view.saves(c.quote)]  # (no on-demand fallback for provision either)
        if not saving and excluded:  # every spot pool worth it failed this run: those no longer cooling again
            saving = [c for c in rank_pools(spec, quotes, stats, now, frozenset(), gang_sizes=True, sized=sized)
                      if view.saves(c.quote)]
        wait = spot_wait_s(spec, job, (saving or ranked)[0].quote, quotes, now, recheck_s, view, time_scale)
        if wait:  # ask again when the first spot pool worth waiting for stops cooling down, if sooner
            back = _first_cooldown_end(spec, [q for q in quotes if view.saves(q)], stats, now)
            wait = min(wait, back) if back else wait
            return LaunchPlan(candidates=[], launch_ranks=list(range(spec.resources.nodes)), wait_s=wait)
        ranked = saving
    # (ordered first, then only the offered ones built: a ranking holds every pool at every gang size)
    at_risk = notice_risk_share(job.attempts)  # (the auto cadence's input: notices the ranks could not save in)
    candidates = [Candidate(pool=c.pool, price_per_hour=c.quote.price_per_hour, score=round(c.score, 4),
                            nodes=c.nodes or spec.resources.nodes, loss_interval_s=loss_interval(c, at_risk=at_risk))
                  for c in _one_size_per_pool(ranked)[:MAX_CANDIDATES]]
    return LaunchPlan(candidates=candidates, launch_ranks=list(range(spec.resources.nodes)))


def _gang_does_not_fit(spec: JobSpec, quotes: list[PoolQuote], stats: dict[str, PoolStats], now: float,
                       excluded: frozenset[str], sized: SizedScores | None = None) -> bool:
    """Some allowed spot pool is left out only because its placement score says it cannot hold the
    gang now (``PlacementConfig.min_gang_score``): capacity comes and goes, so ask again later."""
    dropped = evaluate_pools(spec, quotes, stats, now, excluded, gang_sizes=True, sized=sized).dropped
    return any(why.startswith(GANG_FIT_REASON) for why in dropped.values())


def _first_cooldown_end(spec: JobSpec, quotes: list[PoolQuote], stats: dict[str, PoolStats],
                        now: float) -> int | None:
    """Seconds until the first pool the spec allows stops cooling down; None when no pool would be a
    candidate even then (the spec or its price cap rules them all out)."""
    ends = [s.cooldown_until for s in stats.values() if s.cooldown_until > now]
    if not ends:
        return None
    later = rank_pools(spec, quotes, stats, max(ends) + 1.0, gang_sizes=True)
    firsts = [stats[c.pool.key].cooldown_until for c in later if c.pool.key in stats
              and stats[c.pool.key].cooldown_until > now]
    return max(1, math.ceil(min(firsts) - now)) if firsts else None


def _one_size_per_pool(candidates: list[_Keyed]) -> list[_Keyed]:
    """Each pool once, at its best-ranked size, then each pool again at its next size: so the
    candidates try several pools before a smaller gang in the same one."""
    seen: dict[str, int] = {}
    turn = []  # (how many of its pool's came before it, its rank): a stable sort by that pair
    for i, c in enumerate(candidates):
        k = seen.get(c.pool.key, 0)
        seen[c.pool.key] = k + 1
        turn.append((k, i))
    return [candidates[i] for _, i in sorted(turn)]
