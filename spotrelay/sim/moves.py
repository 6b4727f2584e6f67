"""The simulated placement review and make-before-break move (the ASL's Review and Migrate tasks):
the shipped decision (placement.review.better_placement) over the simulated market, and the move's
launch, drain and restart at the new world size. Split from sim/controller.py, whose run they act on."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from spotrelay.contracts.recovery import AttemptEnd, Candidate, Launched, Verdict
from spotrelay.domain.advice import notice_risk_share
from spotrelay.placement import PoolEvent
from spotrelay.placement.cadence import DUE_SLACK_S, full_review_due, mark_of, poll_s, price_entry
from spotrelay.placement.gang_fit import probe_sizes, scores_of
from spotrelay.placement.payback import spot_stint_hours
from spotrelay.placement.policy import loss_interval
from spotrelay.placement.review import better_placement, keep_to_schedule, review_spot_hours
from spotrelay.placement.spot_evidence import off_on_demand_allowed, stall_limit, wall_limit
from spotrelay.services.review import NOTHING_READ, Decision, review_seconds, stay_fields
from spotrelay.sim import attempts
from spotrelay.sim.asl import TaskFailed
from spotrelay.sim.shortlist import review_quotes, same_review

if TYPE_CHECKING:
    from spotrelay.sim.controller import SpotrelayRun
    from spotrelay.sim.engine import Run

VERIFY_SHORTLIST = False  # tests set it: every review also runs over every quote and must agree
SKIP_POLLS = True  # tests clear it: every poll of the placement review is walked (next_poll_at)
SAVE_MARGIN_S = 10.0  # the final save is timed to commit this long before the reclaim (or a move's deadline)


def _stay(run: SpotrelayRun, payload: dict[str, Any], read: Decision = NOTHING_READ) -> dict[str, Any]:
    """The stay answer for the current attempt (built once per attempt; the workflow only reads it),
    with services/review.py's ``stay_fields`` after a review that read ``read``."""
    if run.stay_answer[0] != run.attempt:
        run.stay_answer = (run.attempt, AttemptEnd(outcome=Verdict.READY, attempt=run.attempt,
                                                   reason="no better placement").model_dump(mode="json"))
    return {**run.stay_answer[1], **stay_fields(run.spec, run.timings, run.attempts, run.now, read,
                                                payload.get("review_mark"), payload.get("review_backoff"),
                                                payload.get("review_s"))}


def next_poll_at(run: SpotrelayRun, timeout_s: float) -> float:
    """When the outcome wait entered now with ``timeout_s`` should time out: the first poll that may do
    something. A poll before its backoff is due that reads the prices the last full review read stays
    and changes nothing the workflow reads but the clock (``stay_fields`` gives it the same mark and
    backoff, and ``poll_s`` the next timeout; one whose gang is not all training reads no prices and
    changes nothing either), so the simulator steps over those, polls at the same times as the
    workflow. Tests walk every poll (``SKIP_POLLS`` False) and compare."""
    t = run.now + timeout_s
    launch = run.walker.data.get("launch") or {}
    raw, last = launch.get("review_backoff"), launch.get("review_mark")
    if not SKIP_POLLS or raw is None or last is None:  # (no full review yet: nothing to step over)
        return t
    if _price_mark(run) != last:
        return t  # the prices moved already (a poll whose gang did not train saw it): the next poll decides
    due, until = raw["due"], run.price_mark_memo[0]
    base = review_seconds(run.spec, run.timings)
    while t < due - DUE_SLACK_S and t < until:  # that poll reads the same prices, before its due time
        t += poll_s(base, due, t)
    return t


def _price_mark(run: SpotrelayRun) -> str:
    """review.decide's mark of the prices it read: the quote price now of every pool of the spec's
    regions, instance types and markets (sim/quotes.py rounds a quote's price so). Kept until the first
    of those prices changes (a slot's end; never on a trace)."""
    now = run.now
    until, mark = run.price_mark_memo
    if now < until:
        return mark
    pools = run.mark_pools
    if pools is None:  # (the spec's pools: the spec and the market's pools are fixed for the run)
        res = run.spec.resources
        markets, regions, types = {m.value for m in res.markets}, set(res.regions), set(res.instance_types)
        pools = run.mark_pools = [p for p in run.market.pools if p.pool.market in markets
                                  and p.pool.region in regions and p.pool.instance_type in types]
        run.mark_entries = [(math.nan, "")] * len(pools)
    entries, next_change = run.mark_entries, math.inf
    for i, p in enumerate(pools):  # each pool's part of the mark, made again only when its price changed
        price, until = p.price_span(now)
        price = round(price, 4)
        next_change = min(next_change, until)
        if entries[i][0] != price:
            entries[i] = (price, price_entry(p.key, price))
    mark = mark_of(entry for _, entry in entries)
    run.price_mark_memo = (next_change, mark)
    return mark


def _spot_hours(run: SpotrelayRun) -> float | None:
    """review_spot_hours over the run's attempts (it looks at the last few only)."""
    current = run.attempt_pool
    return review_spot_hours(run.attempts, current.pool.market if current else "spot", run.now)


def _stints(run: SpotrelayRun) -> float | None:
    """spot_stint_hours over the run's attempts, computed again only when an attempt that could close a
    stint was added: it walks them all (a stormy job has hundreds), and by its definition a stint counts
    once an on-demand attempt follows it, so attempts on spot added after the last computation change
    nothing (attempts are only appended; only the last one is replaced, when it ends, with the same pool
    and start; an earlier one gets its save, sim/attempts.py, which it does not read). Tests compare it
    with the full computation on every review (VERIFY_SHORTLIST)."""
    attempts = run.attempts
    memo = run.stint_memo
    if memo is None or any(a.pool is None or a.pool.market != "spot" for a in attempts[memo[0]:]):
        memo = (len(attempts), spot_stint_hours(attempts))
    elif memo[0] != len(attempts):
        memo = (len(attempts), memo[1])
    run.stint_memo = memo
    return memo[1]


def on_demand_quotes(run: Run) -> list[Any]:
    """The on-demand pools' quotes: all ``spot_evidence`` reads of the market (their price; the runner's
    advice too)."""
    return [run.market.quote(p, run.now) for p in run.market.pools if not p.spot]


def review(self: SpotrelayRun, payload: dict[str, Any]) -> dict[str, Any]:
    """review.review: stay (READY) or MIGRATE with the target (agents always heartbeat here)."""
    current, gang = self.attempt_pool, list(self.gang.values())
    if (int(payload.get("attempt", 0)) != self.attempt or not self.running or current is None
            or self.spec.recovery.review_minutes <= 0 or any(n.state != "RUNNING" for n in gang)):
        return _stay(self, payload)  # (review.decide reads no prices then)
    mark = _price_mark(self)
    backoff = payload.get("review_backoff")
    if not full_review_due(self.now, None if backoff is None else backoff["due"], mark, payload.get("review_mark")):
        return _stay(self, payload, Decision(None, mark))  # a poll: the prices alone (review.decide)
    res = self.spec.resources
    here = self.market.quote(current, self.now, res.nodes + res.spares, len(self.held.get(current.key, ())))
    stats = self.stats.view()  # (the pools' records; nothing records during a review)
    excluded = frozenset(self.excluded)
    # the shortlist holds the pool better_placement would pick from every quote (sim/shortlist.py)
    held = {k: len(v) for k, v in self.held.items()}  # review.review: scores for the elastic sizes too
    sized = {m: scores_of(self.market.quotes(self.now, m, held)) for m in probe_sizes(self.spec)}
    quotes = review_quotes(self, here, len(gang), stats, excluded, sized)
    spot_hours = _spot_hours(self)
    stints = _stints(self)
    move = same_review(self, here, len(gang), quotes, stats, excluded, spot_hours, sized, stints)  # memoized
    if VERIFY_SHORTLIST:  # tests: the same decision as from every quote
        every = better_placement(self.spec, here, len(gang), self._quotes(), stats, self.now, excluded,
                                 config=self.config, spot_hours=_spot_hours(self),
                                 sized=sized, stint_hours=stints, boot_s=self.market.expected_boot_s)
        assert every == move and spot_hours == _spot_hours(self) and stints == spot_stint_hours(self.attempts), (
            every, move)
    keep_pace, records, on_demand = False, None, None  # (the records as they hold now: read once, when needed)
    if self.spec.recovery.max_slowdown is not None:  # review.decide: the schedule
        records, on_demand = attempts.as_of_now(self), on_demand_quotes(self)
        move, keep_pace = keep_to_schedule(self.spec, here, len(gang), on_demand, stats, self.now, records, move,
                                           excluded, config=self.config, boot_s=self.market.expected_boot_s,
                                           since=self.created_at)
    if move is not None and not off_on_demand_allowed(
            move.target.pool.market, current.pool.market,
            attempts.as_of_now(self) if records is None else records,
            on_demand_quotes(self) if on_demand is None else on_demand, self.now,
            stalled=stall_limit(self.spec), wall=wall_limit(self.spec, self.created_at)):
        move = None  # review.review: the job's spot attempts did not pay (placement/spot_evidence.py)
    if move is None:
        return _stay(self, payload, Decision(None, mark, True, keep_pace=keep_pace))
    t = move.target
    leaving = [] if move.in_place else gang
    interval = loss_interval(t, at_risk=notice_risk_share(self.attempts))
    return AttemptEnd(outcome=Verdict.MIGRATE, attempt=self.attempt, reason=move.reason,
                      lost_ranks=tuple(sorted(n.rank for n in leaving)),
                      target=Candidate(pool=t.pool, price_per_hour=t.quote.price_per_hour, score=round(t.score, 4),
                                       nodes=t.nodes, loss_interval_s=interval)).model_dump(mode="json")


def migrate(self: SpotrelayRun, move: AttemptEnd) -> dict[str, Any]:
    """migrate.migrate: launch the target first; then the old ranks save by its ready time and the
    leaving ones drain (a self-imposed notice). No capacity: stay (the workflow waits again)."""
    target, gang = move.target, list(self.gang.values())
    if (target is None or move.attempt != self.attempt or not self.running
            or any(n.state != "RUNNING" for n in gang)):
        raise TaskFailed("MoveCancelledError", "the attempt changed")
    sp = self.market.by_key[target.pool.key]
    world = target.nodes or self.job.nodes
    lost = set(move.lost_ranks)
    leaving = [n for n in gang if n.rank in lost]
    staying = [n for n in gang if n.rank not in lost]  # (ranks are unique in a gang)
    ranks = sorted(set(range(world)) - {n.rank for n in staying})
    attempt = self.attempt + 1
    nodes = self.launch(sp, ranks, attempt) if ranks else []
    if nodes is None:
        self.stats.record(sp.key, PoolEvent.CAPACITY_FAILURE, self.now)
        raise TaskFailed("InsufficientCapacityError", f"no capacity in {sp.key} for the move")
    self.stats.record(sp.key, PoolEvent.LAUNCHED, self.now)
    deadline = self.now + self.market.expected_boot_s(sp.pool)  # as services/migrate.py: the target's boot
    for node in leaving:
        node.state = "DOOMED"
        self.voluntary[node.instance_id] = deadline
        self.draining.append(node)
    flush = self.job.flush_s()  # every rank saves as late as its flush allows (as after a notice)
    save_t = max(self.now, deadline - flush - SAVE_MARGIN_S)
    step = int(self.step_at(save_t) + 1e-6)
    self.at(save_t + flush, self._exit_all, (self.epoch, step, self.attempt))
    current = self.attempt_pool
    if current is not None:
        hours = max(0.0, self.now - self.attempt_start) / 3600.0 * max(1, len(gang))
        self.stats.record(current.key, PoolEvent.OBSERVED, self.now, hours=hours)
    attempts.close(self, move.outcome.value)
    for n in staying:  # the RESTART directive at the new world size
        n.attempt = attempt
        n.state = "READY"
    self.gang = {**{n.rank: n for n in staying}, **{n.rank: n for n in nodes}}
    self.attempt, self.excluded = attempt, set()
    self.attempt_pool, self.attempt_start = sp, self.now
    attempts.opened(self, attempt, sp.pool, target.price_per_hour, len(self.gang), world, len(staying),
                    target.loss_interval_s)
    self.decisions.append({"attempt": attempt, "pool": sp.key, "resumed_from_step": self.ckpt_step})
    self.metrics.moves += 1
    self.note(sp.key, f"move x{world} ({move.reason[:60]})")
    return Launched(attempt=attempt, pool=sp.pool, price_per_hour=target.price_per_hour, nodes=len(self.gang),
                    world_size=world, review_s=review_seconds(self.spec, self.timings)).model_dump(mode="json")
