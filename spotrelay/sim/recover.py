"""The simulated Plan, Provision and Recover tasks of the job-run ASL: the glue between the run's
in-memory state and the shipped decisions, following spotrelay/services/plan.py (plan),
workflow_tasks.py (provision) and spotrelay/services/recovery_flow.py (recover) line by line. Split from
sim/controller.py, whose run they act on (its ``task_plan``/``task_provision``/``task_recover``
delegate here)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from spotrelay.contracts.recovery import AttemptEnd, Launched, LaunchPlan, RecoveryAction, RecoveryPlan, Verdict
from spotrelay.errors import NoPlacementError, RetryBudgetExhaustedError
from spotrelay.placement import PoolEvent
from spotrelay.placement.gang_fit import probe_sizes, scores_of
from spotrelay.placement.policy import gang_key, spare_count
from spotrelay.placement.spot_evidence import last_chance
from spotrelay.placement.spot_wait import plan_view, wait_left_s
from spotrelay.recovery import RecoveryContext, check_retry_budget, classify_nodes, plan_recovery, stall
from spotrelay.services.plan import MAX_CANDIDATES, _keeping_plan, _new_gang_plan, placing_overdue, within_bound
from spotrelay.services.recovery_flow import _result as recovery_result
from spotrelay.services.recovery_flow import recovery_backoff_s
from spotrelay.services.review import review_seconds
from spotrelay.sim import attempts, budget, moves, spares
from spotrelay.sim.asl import TaskFailed
from spotrelay.sim.shortlist import plan_quotes, recovery_quotes

if TYPE_CHECKING:
    from spotrelay.sim.controller import SpotrelayRun


def plan(self: SpotrelayRun, payload: dict[str, Any]) -> dict[str, Any]:
    """plan.plan: execute a keeping RecoveryPlan, else rank the pools for a new gang."""
    recovery = RecoveryPlan.model_validate(payload.get("recovery") or {})
    stats = self.stats.get_many(p.key for p in self.market.pools)
    job = attempts.light_job(self)
    budget.check_plan(self)  # plan.plan: the closed attempts spent the budget
    overdue = placing_overdue(self.spec, job, self.now)
    if overdue:  # plan.plan: recovery.max_placing_minutes without a gang
        self.metrics.failed_reason = overdue
        raise TaskFailed("NoPlacementError", overdue)
    launch = None
    if recovery.keeps:  # _keeping_plan reads only the survivors' pool's quote
        assert recovery.pool is not None
        home = self.market.by_key.get(recovery.pool.key)
        res = self.spec.resources
        few = [] if home is None else [
            self.market.quote(home, self.now, res.nodes + res.spares, len(self.held.get(home.key, ())))]
        launch = _keeping_plan(self.spec, recovery, job, few, stats)
    if launch is None:
        asked = {k: len(v) for k, v in self.held.items()}  # the quotes are asked before survivors go
        if recovery.keep_instance_ids:  # the survivors' pool refused the replacements: they go too
            kept = set(recovery.keep_instance_ids)  # (plan.drop_survivors: saving ones drain)
            for node in [n for n in self.gang.values() if n.instance_id in kept]:
                del self.gang[node.rank]
                if recovery.deadline is not None and recovery.deadline > self.now and self.running and (
                        node in self.seg_nodes):
                    self.draining.append(node)
                else:
                    self.release(node)
            for take in recovery.promoted:
                if take.instance_id in self.bench:
                    self.end_node(self.bench.pop(take.instance_id))
        held = {k: len(v) for k, v in self.held.items()}  # plan.plan: scores for elastic sizes
        sized = {m: scores_of(self.market.quotes(self.now, m, held)) for m in probe_sizes(self.spec)}
        # Plan offers the first MAX_CANDIDATES pools, or while the job may wait for spot the first of
        # those that are spot's saving: a shortlist holds them (sim/shortlist.py). The wait's bounds and
        # whether any pool saves read every pool's price (unsized quotes give the same prices, without a
        # placement score's noise draw); the view holds Plan's spot verdict (spot_evidence.spot_given_up)
        res = self.spec.resources
        prices = self.market.quotes(self.now)
        view = plan_view(self.spec, job, prices, self.now)
        did_not_pay = view.did_not_pay
        waits = wait_left_s(self.spec, job, prices, self.now, view) > 0
        short = None if did_not_pay else plan_quotes(self, asked, stats, frozenset(job.excluded_pools),
                                                     MAX_CANDIDATES, sized,
                                                     {q.pool.key: view.saves(q) for q in prices} if waits else None)
        quotes = (self.market.quotes(self.now, res.nodes + res.spares, asked)
                  if short is None or moves.VERIFY_SHORTLIST else short)
        try:  # (VERIFY_SHORTLIST: from every quote as the Lambda computes it, nothing passed in)
            launch = _new_gang_plan(self.spec, job, quotes, stats, self.now, sized,
                                    None if moves.VERIFY_SHORTLIST else view)
        except NoPlacementError as exc:
            raise TaskFailed("NoPlacementError", str(exc)) from None
        if moves.VERIFY_SHORTLIST and short is not None:  # tests: the same plan as from every quote
            assert _new_gang_plan(self.spec, job, short, stats, self.now, sized, view) == launch
    launch = budget.check_launch(self, job, within_bound(self.spec, job, launch, self.now))
    return launch.model_dump(mode="json")



def provision(self: SpotrelayRun, payload: dict[str, Any]) -> dict[str, Any]:
    """workflow_tasks.provision: the first candidate with capacity; failures cool down.
    From the Prewarm state (``standby``): prewarm.prewarm, one rebalance standby; from the Migrate
    state (``move``): migrate.migrate."""
    if payload.get("standby") is not None:
        return spares.prewarm(self, AttemptEnd.model_validate(payload["standby"]))
    if payload.get("move") is not None:
        return self.task_migrate(AttemptEnd.model_validate(payload["move"]))
    plan = LaunchPlan.model_validate(payload["plan"])
    keep = set(plan.keep_instance_ids)
    extra = spares.left(self, plan.promoted)  # workflow_tasks._left_spares
    spare_ranks = spares.to_launch(self, plan.promoted)
    attempt = self.attempt + 1
    failed: list[str] = []
    for candidate in plan.candidates:
        sp = self.market.by_key[candidate.pool.key]
        world, ranks = plan.ranks_for(candidate)
        ranks = ranks + [r for r in extra if r not in ranks]
        # spares boot with the ranks (one all-or-none launch; spot pools only), as provision asks
        wanted = ranks + (spare_ranks if spare_count(self.spec, candidate.pool) else [])
        nodes = self.launch(sp, wanted, attempt) if wanted else []
        if nodes is None and wanted != ranks:  # workflow_tasks._launch: the spares are best effort
            nodes = self.launch(sp, ranks, attempt) if ranks else []
        if nodes is None:  # workflow_tasks.provision: a smaller gang may still fit (no cooldown)
            if not plan.keeps and world > self.spec.resources.smallest_gang:
                failed.append(gang_key(sp.key, world))
            else:
                self.stats.record(sp.key, PoolEvent.CAPACITY_FAILURE, self.now)
                failed.append(sp.key)
            continue
        self.stats.record(sp.key, PoolEvent.LAUNCHED, self.now)
        survivors = {r: n for r, n in self.gang.items() if n.instance_id in keep}
        for n in self.gang.values():
            if n.instance_id not in keep:
                self.release(n)
        for n in survivors.values():  # the RESTART directive: they rejoin and report ready
            if n.end_t is None:  # billed since recover closed their attempt (workflow_tasks.provision)
                attempts.outlived(self, n)
            n.attempt = attempt
            if n.end_t is None:  # one EC2 took meanwhile stays gone: the ready wait sees it
                # workflow_tasks._carry_survivors: one EC2 noticed since recover stays doomed
                doomed = n.state == "DOOMED" or n.instance_id in self.noticed
                n.state, n.exit_code = ("DOOMED" if doomed else "READY"), None
        self.gang = {**survivors, **spares.join(self, nodes, spare_ranks, plan.promoted, attempt)}
        self.attempt, self.excluded = attempt, set()
        self.attempt_pool, self.attempt_start = sp, self.now
        fresh = sum(1 for n in nodes if n.rank not in spare_ranks)  # (the gang but for these: carried over)
        attempts.opened(self, attempt, sp.pool, candidate.price_per_hour, len(self.gang), world,
                        len(self.gang) - fresh, candidate.loss_interval_s)
        self.decisions.append({"attempt": attempt, "pool": sp.key, "resumed_from_step": self.ckpt_step})
        return Launched(attempt=attempt, pool=sp.pool, price_per_hour=candidate.price_per_hour,
                        nodes=len(self.gang), world_size=world,
                        review_s=review_seconds(self.spec, self.timings)).model_dump(mode="json")
    self.excluded |= set(failed)
    raise TaskFailed("InsufficientCapacityError", f"no capacity in {len(failed)} pools")



def recover(self: SpotrelayRun, payload: dict[str, Any]) -> dict[str, Any]:
    """recovery_flow.recover: take the settled AttemptEnd, charge the budget, plan the strategy."""
    end = AttemptEnd.model_validate(payload.get("outcome") or {})
    if end.deadline is None and not self.overlapping():
        if self.running:  # a verdict that ends a running attempt without a save
            self.stop_training(self.committed(self.now))
        self.epoch += 1
    # else: launch_at_notice, the ranks keep training and save by the deadline (_exit_all); or the
    # verdict is the new gang's (lost while booting), and the last gang still trains to its save
    nodes = self._records()
    if end.outcome.timed_out:  # _settled_end: the silent nodes are lost, classified once here
        # recovery_flow._mark_unresponsive: ready -> the nodes still PENDING; heartbeat -> every live
        # node (agents heartbeat while alive here, so none is staler than another)
        gone = ("DOOMED", "LOST", "TERMINATED", "EXITED")
        for n in self.gang.values():
            if n.state == "PENDING" or (end.outcome is Verdict.HEARTBEAT_TIMEOUT and n.state not in gone):
                n.state = "LOST"
        nodes = self._records()
        try:
            end = classify_nodes(nodes)
        except ValueError:
            end = AttemptEnd(outcome=Verdict.NODE_LOST, attempt=self.attempt, reason=str(end.outcome),
                             lost_ranks=tuple(n.rank for n in nodes))
    self.metrics.interruptions += 1
    try:
        stalled, progress = stall(self.stalled, self.progress_step, self.committed(self.now))  # the newest in S3
        decision = check_retry_budget(self.spec.recovery, end, self.recoveries, self.user_restarts, stalled)
    except RetryBudgetExhaustedError as exc:
        self.metrics.failed_reason = str(exc)
        raise TaskFailed("RetryBudgetExhaustedError", str(exc)) from None
    current = self.attempt_pool
    if current is not None:
        hours = max(0.0, self.now - self.attempt_start) / 3600.0 * max(1, len(self.gang))
        self.stats.record(current.key, PoolEvent.OBSERVED, self.now, hours=hours)
    keep: list[str] = []
    action = RecoveryAction.NEW_CLUSTER
    home = None
    attempts.close(self, end.outcome.value, noticed=True)
    stats = self.stats.get_many(p.key for p in self.market.pools)
    excluded = frozenset(self.excluded)
    # the strategies read the best candidate and the survivors' pool: the shortlist holds both (sim/shortlist.py)
    quotes = recovery_quotes(self, stats, excluded)
    chance = last_chance(self.spec, stalled + 1)
    try:
        plan = plan_recovery(RecoveryContext(spec=self.spec, outcome=end, nodes=nodes, quotes=quotes,
                                             stats=stats, now=self.now, excluded=excluded,
                                             config=self.config, quotes_for=self._quotes_for,
                                             last_chance=chance, backoff_s=_backoff_s(self, end),
                                             **self.context_extra))
        keep, action, home = list(plan.keep_instance_ids), RecoveryAction(plan.action), plan.pool
    except NoPlacementError:
        pass
    if moves.VERIFY_SHORTLIST:  # tests: the same decision as from every quote
        _verify_recovery(self, end, nodes, stats, excluded, (keep, action, home), chance)
    if end.outcome is Verdict.USER_ERROR and action is not RecoveryAction.NEW_CLUSTER:
        keep, action = [], RecoveryAction.NEW_CLUSTER
    spares.on_recover(self, home if action is not RecoveryAction.NEW_CLUSTER else None, nodes, keep)
    for node in list(self.gang.values()):
        if node.instance_id in keep:
            continue
        if end.deadline is not None and node.state in ("READY", "RUNNING", "DOOMED") and self.running and (
                node in self.seg_nodes):
            self.draining.append(node)  # recovery_flow._drain: a rank still saving finishes its save (one
            # of a new gang that never trained has none to make: it exits at once)
        elif not (end.deadline is not None and node.state == "DOOMED"):
            self.release(node)  # (a doomed node drains: it saves until EC2 takes it)
    if action is RecoveryAction.NEW_CLUSTER and current is not None and end.outcome in (
            Verdict.INTERRUPTED, Verdict.NODE_LOST, Verdict.INFRA_ERROR):
        self.excluded.add(current.key)
    self.recoveries, self.user_restarts = decision.recoveries, decision.user_restarts
    self.stalled, self.progress_step = decision.stalled, progress
    records = self._records()
    self.gang = {n.rank: n for n in self.gang.values() if n.end_t is None and n.instance_id in keep}
    self.note(current.key if current else "", f"recover: {end.outcome.value}, {action.value}")
    result = recovery_result(attempts.light_job(self), records, self.timings, end, end.reason, spares.records(self))
    return result.model_dump(mode="json")


def _backoff_s(self: SpotrelayRun, end: AttemptEnd) -> int:
    """recovery_flow.recovery_backoff_s (the ending attempt is closed here already)."""
    return recovery_backoff_s(attempts.light_job(self), self.timings, end)


def _verify_recovery(self: SpotrelayRun, end: AttemptEnd, nodes: list[Any], stats: dict[str, Any],
                     excluded: frozenset[str], got: tuple[list[str], RecoveryAction, Any], chance: bool) -> None:
    want: tuple[list[str], RecoveryAction, Any]
    try:
        every = plan_recovery(RecoveryContext(spec=self.spec, outcome=end, nodes=nodes, quotes=self._quotes(),
                                              stats=stats, now=self.now, excluded=excluded, config=self.config,
                                              quotes_for=self._quotes_for, last_chance=chance,
                                              backoff_s=_backoff_s(self, end),
                                              **self.context_extra))
        want = (list(every.keep_instance_ids), RecoveryAction(every.action), every.pool)
    except NoPlacementError:
        want = ([], RecoveryAction.NEW_CLUSTER, None)
    assert want == got, (want, got)
