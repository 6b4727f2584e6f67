"""spotrelay's controller in the simulator: the job-run ASL walked state by state, its tasks served
by the shipped decisions through in-memory state.

- Plan/Provision/Recover call placement (``evaluate_pools``/``rank_pools``), the pool stats store and
  its cooldowns (``InMemoryPoolStatsStore``), ``classify_nodes``, ``check_retry_budget``,
  ``plan_recovery`` and ``backoff_seconds`` exactly as the Lambdas do (spotrelay/services/
  workflow_tasks.py and recovery_flow.py); the glue between them follows those services line by
  line and names them where it does.
- The two task-token waits resolve with ``ready_verdict``/``outcome_verdict`` (spotrelay/services/
  waits.py) over the gang's node records, so the Choice states see the verdicts the Lambdas send.
- Node records change the way the event handlers change them: a notice marks the node DOOMED and
  records INTERRUPTED for its pool; the ranks keep training and save as late as the flush allows,
  then exit 75 (76 when the save cannot finish before the reclaim); an unannounced reclaim marks it
  LOST; a rebalance recommendation takes a proactive checkpoint.
"""

from __future__ import annotations

from typing import Any

from spotrelay.contracts.exit_codes import ExitCode
from spotrelay.contracts.recovery import (
    AttemptEnd,
    Launched,
    LaunchPlan,
    RecoveryAction,
    RecoveryPlan,
    Verdict,
)
from spotrelay.contracts.workflow import WorkflowTimings
from spotrelay.domain.models import Attempt, Job, Node, NodeState
from spotrelay.domain.status import JobStatus
from spotrelay.errors import NoPlacementError, RetryBudgetExhaustedError
from spotrelay.placement import CooldownPolicy, InMemoryPoolStatsStore, PoolEvent
from spotrelay.placement.policy import DEFAULT_CONFIG, gang_key, spare_count
from spotrelay.recovery import RecoveryContext, check_retry_budget, classify_nodes, plan_recovery
from spotrelay.services.recovery_flow import _result as recovery_result
from spotrelay.services.waits import outcome_verdict, ready_verdict
from spotrelay.services.workflow_tasks import _keeping_plan, _new_gang_plan, review_seconds
from spotrelay.sim import moves, spares
from spotrelay.sim.asl import Await, Finished, Sleep, TaskFailed, Walker, load_asl
from spotrelay.sim.engine import Run, SimNode
from spotrelay.sim.job import JobModel
from spotrelay.sim.market import Market
from spotrelay.sim.moves import SAVE_MARGIN_S
from spotrelay.spec.models import JobSpec

_ASL_CACHE: dict[str, Any] = {}


class SpotrelayRun(Run):
    def __init__(self, market: Market, job: JobModel, seed: int, *, regions: list[str], instance_types: list[str],
                 timings: WorkflowTimings | None = None, cooldown: CooldownPolicy | None = None,
                 asl: dict[str, Any] | None = None, rebalance_checkpoint: bool = True,
                 markets: tuple[str, ...] = ("spot", "on-demand"), spec: JobSpec | None = None,
                 spec_overrides: dict[str, dict[str, Any]] | None = None, keep_margin: float | None = None,
                 **kw: Any) -> None:
        super().__init__(market, job, seed, **kw)
        self.spec = spec or job.spec(regions, instance_types, list(markets))
        if spec_overrides:  # switches on the spec: resources.spares, recovery.launch_at_notice, ...
            doc = self.spec.model_dump(mode="json")
            for section, values in spec_overrides.items():
                doc[section] = {**doc.get(section, {}), **values}
            self.spec = JobSpec.model_validate(doc)
        self._spec_doc = self.spec.model_dump(mode="json")
        self.timings = timings or WorkflowTimings()
        self.stats = InMemoryPoolStatsStore(cooldown)  # None: the shipped CooldownPolicy()
        self.config = DEFAULT_CONFIG  # what the services use; sweeping it means changing the default
        self.rebalance_checkpoint = rebalance_checkpoint
        # RecoveryContext's keep_margin (None: its default, what recover uses); a sweep, not a decision
        self.context_extra: dict[str, Any] = {} if keep_margin is None else {"keep_margin": keep_margin}
        self.attempt = 0
        self.recoveries = self.user_restarts = 0
        self.excluded: set[str] = set()
        self.attempt_pool: Any = None
        self.attempt_start = 0.0
        self.attempts: list[Attempt] = []  # what the job record's attempts say (backoff streak, world size)
        self.voluntary: dict[str, float] = {}  # instance id -> a review's save deadline (its reclaim_at)
        self.draining: list[SimNode] = []  # released by the workflow, still saving: end at their exit
        self.waiting: str | None = None
        self.wait_epoch = 0
        self.ready_pending = 0
        self.short_starts = 0  # trainings started with fewer ranks than the gang (should stay 0)
        self.decisions: list[dict[str, Any]] = []  # attempt, pool, resumed_from (calibration)
        self._node_template: Node | None = None
        if asl is None:
            asl = _ASL_CACHE.get("job_run") or _ASL_CACHE.setdefault("job_run", load_asl())
        self.walker = Walker(asl, {
            "fn_sfn_plan": self.task_plan, "fn_sfn_provision": self.task_provision,
            "fn_sfn_recover": self.task_recover, "fn_sfn_teardown": self.task_teardown,
            "fn_sfn_review": self.task_review,
            "fn_sfn_finalize": self.task_finalize,
        }, {"job_id": "sim", "timings": self.timings.model_dump()})

    # --- driving the walker ---------------------------------------------------------------------
    def start(self) -> None:
        self.at(self.now, self._step, None)

    def _step(self, result: Any) -> None:
        self._handle(self.walker.resume(result))

    def _handle(self, what: Sleep | Await | Finished) -> None:
        if isinstance(what, Sleep):
            self.at(self.now + what.seconds, self._step, None)
        elif isinstance(what, Await):
            self.waiting = what.wait
            self.wait_epoch += 1
            if what.timeout_s is not None:
                self.at(self.now + what.timeout_s, self._timeout, self.wait_epoch)
            self._settle()
        elif what.failed:
            self.metrics.failed_reason = self.metrics.failed_reason or f"job failed ({what.state})"
        else:
            self.finish()

    def _timeout(self, epoch: int) -> None:
        if self.waiting is not None and epoch == self.wait_epoch:
            self.waiting = None
            self._handle(self.walker.resume(error="States.Timeout"))

    def _records(self) -> list[Node]:
        # copies of one validated record: the values are typed already, and validating each record
        # was a third of a stormy run's CPU
        if self._node_template is None:
            self._node_template = Node(job_id="sim", node_id="a0-r0", attempt=0, rank=0, instance_id="i-0",
                                       pool=self.market.pools[0].pool, state=NodeState.PENDING)
        make = self._node_template.model_copy
        return [make(update={"node_id": f"a{n.attempt}-r{n.rank}", "attempt": self.attempt, "rank": n.rank,
                             "instance_id": n.instance_id, "pool": n.pool.pool, "state": NodeState(n.state),
                             "exit_code": n.exit_code, "reclaim_at": self.voluntary.get(n.instance_id, n.removal_t)
                             if n.state == "DOOMED" else None})
                for n in sorted(self.gang.values(), key=lambda n: n.rank)]

    def _job(self) -> Job:
        return Job(job_id="sim", name="sim", status=JobStatus.RUNNING, attempt=self.attempt, spec=self._spec_doc)

    def _settle(self) -> None:
        """waits.settle: deliver the verdict of the registered wait once the node records give one."""
        if self.waiting is None:
            return
        if self.waiting == "ready":
            if any(n.state == "PENDING" for n in self.gang.values()) and not any(
                    n.state in ("DOOMED", "LOST", "TERMINATED", "EXITED") for n in self.gang.values()):
                return  # still booting and nothing went away: no verdict yet (skip building records)
            verdict = ready_verdict(self._job(), self._records())
        else:
            if all(n.state in ("READY", "RUNNING") for n in self.gang.values()):
                return
            verdict = outcome_verdict(self._job(), self._records())
        if verdict is None:
            return
        self.waiting = None
        if verdict.outcome is Verdict.READY:
            self.at(self.now + self.job.restore_s(), self._train, self.epoch)
        self._handle(self.walker.resume(verdict.model_dump(mode="json")))

    # --- market and agent events (the event handlers' effect on the records) --------------------
    def _train(self, epoch: int) -> None:
        if epoch != self.epoch or self.running or not self.gang:
            return
        if any(n.state != "READY" or n.end_t is not None for n in self.gang.values()):
            return
        world = self.attempts[-1].world_size if self.attempts else self.job.nodes
        if len(self.gang) != world:  # never expected: a gang trains whole
            self.short_starts += 1
            return
        for n in self.gang.values():
            n.state = "RUNNING"
        info = next(iter(self.gang.values())).pool
        self.start_training(info.pool.instance_type, info.gpus * len(self.gang), world=world)
        self.note(info.key, f"training from step {self.ckpt_step}")

    def on_booted(self, node: SimNode) -> None:
        self._settle()

    def on_notice(self, node: SimNode) -> None:
        """interruptions.interruption_notice: count it, doom the node, every rank saves late."""
        if spares.off_bench(self, node):  # a spare only leaves the bench
            return
        self.stats.record(node.pool.key, PoolEvent.INTERRUPTED, self.now)
        if node.rank not in self.gang or self.gang[node.rank] is not node or node.state in ("LOST", "TERMINATED"):
            return
        if node.state not in ("DOOMED", "EXITED"):
            node.state = "DOOMED"
        self.note(node.pool.key, f"notice rank {node.rank}")
        if self.running:
            flush = self.job.flush_s()
            save_t = max(self.now, node.removal_t - flush - SAVE_MARGIN_S)
            commit_t = save_t + flush
            saved = commit_t <= node.removal_t
            step = int(self.step_at(save_t) + 1e-6)
            self.at(commit_t if saved else node.removal_t, self._exit_all,
                    (self.epoch, step if saved else None, self.attempt))
            self._settle()  # with launch_at_notice the outcome wait ends now, with the deadline
        elif self.waiting == "outcome":  # ready, still restoring: nothing new to save, the ranks stop
            self._exit_all((self.epoch, self.ckpt_step, self.attempt))
        else:
            self._settle()

    def _exit_all(self, arg: tuple[int, int | None, int]) -> None:
        """The ranks of ``attempt`` committed their save (``step``; None: it missed the reclaim) and exit.
        With launch_at_notice the workflow has already moved on: survivors kept for the next attempt
        keep their instances, and the new gang trains from this save once it is ready."""
        epoch, step, attempt = arg
        if epoch != self.epoch:
            self._release_drained(attempt)
            return
        if self.running:
            self.stop_training(step if step is not None else self.committed(self.now))
        else:
            self.epoch += 1  # the pending start of training is off
        code = ExitCode.PREEMPTED_SAVED if step is not None else ExitCode.PREEMPTED_UNSAVED
        for n in self.gang.values():
            if n.attempt == attempt and n.state not in ("LOST", "TERMINATED"):
                n.state, n.exit_code = "EXITED", int(code)
        self._release_drained(attempt)
        if attempt != self.attempt and self.gang and all(
                n.state == "READY" for n in self.gang.values()):
            self.at(self.now + self.job.restore_s(), self._train, self.epoch)  # the new gang was ready first
        self._settle()

    def _release_drained(self, attempt: int) -> None:
        """Ranks the workflow let drain (a move's, or survivors dropped mid-save) exit: released."""
        for n in [n for n in self.draining if n.attempt == attempt]:
            self.draining.remove(n)
            if n.end_t is None:
                n.state, n.exit_code = "EXITED", int(ExitCode.PREEMPTED_SAVED)
                self.end_node(n, "EXITED")

    def on_rebalance(self, node: SimNode) -> None:
        if not self.running or self.gang.get(node.rank) is not node:
            return
        if self.rebalance_checkpoint:
            self.force_checkpoint(self.now, self.now + self.job.persist_s() + self.job.stall_s(
                node.pool.pool.instance_type))
        ask = spares.request_standby(self, node)
        if ask is not None:  # the outcome wait ends with REBALANCE: the ASL's Prewarm boots a standby
            self.waiting = None
            self._handle(self.walker.resume(ask.model_dump(mode="json")))

    def on_removed(self, node: SimNode, announced: bool) -> None:
        if spares.off_bench(self, node) or self.gang.get(node.rank) is not node:
            return
        if self.running:  # a rank of a running gang is gone (unannounced, or its save never came): it ends now
            node.state = "LOST"
            self.stop_training(self.committed(self.now))
            self.note(node.pool.key, f"rank {node.rank} lost while training")
        self._settle()

    def on_training_done(self) -> None:
        for n in self.gang.values():
            if n.state not in ("LOST", "TERMINATED"):
                n.state, n.exit_code = "EXITED", int(ExitCode.DONE)
        self._settle()

    # --- the ASL's tasks ------------------------------------------------------------------------
    def _light_job(self) -> Job:
        """The job record fields the services' pure helpers read."""
        return Job(job_id="sim", name="sim", status=JobStatus.RECOVERING, attempt=self.attempt,
                   recoveries=self.recoveries, user_restarts=self.user_restarts, attempts=self.attempts[-50:],
                   excluded_pools=sorted(self.excluded), spec={"resources": {"nodes": self.job.nodes}})

    def _quotes(self) -> list[Any]:
        """The MarketData port's answer, placement scores sized for the launch as the services ask."""
        res = self.spec.resources
        return self.market.quotes(self.now, res.nodes + res.spares, {k: len(v) for k, v in self.held.items()})

    def task_plan(self, payload: dict[str, Any]) -> dict[str, Any]:
        """workflow_tasks.plan: execute a keeping RecoveryPlan, else rank the pools for a new gang."""
        recovery = RecoveryPlan.model_validate(payload.get("recovery") or {})
        quotes = self._quotes()
        stats = self.stats.get_many(p.key for p in self.market.pools)
        job = self._light_job()
        launch = _keeping_plan(self.spec, recovery, job, quotes, stats) if recovery.keeps else None
        if launch is None:
            if recovery.keep_instance_ids:  # the survivors' pool refused the replacements: they go too
                kept = set(recovery.keep_instance_ids)  # (workflow_tasks.drop_survivors: saving ones drain)
                for node in [n for n in self.gang.values() if n.instance_id in kept]:
                    del self.gang[node.rank]
                    if recovery.deadline is not None and recovery.deadline > self.now and self.running:
                        self.draining.append(node)
                    else:
                        self.end_node(node)
                for take in recovery.promoted:
                    if take.instance_id in self.bench:
                        self.end_node(self.bench.pop(take.instance_id))
            try:
                launch = _new_gang_plan(self.spec, job, quotes, stats, self.now)
            except NoPlacementError as exc:
                raise TaskFailed("NoPlacementError", str(exc)) from None
        return launch.model_dump(mode="json")

    def task_provision(self, payload: dict[str, Any]) -> dict[str, Any]:
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
                    self.end_node(n)
            for n in survivors.values():  # the RESTART directive: they rejoin and report ready
                n.attempt = attempt
                if n.end_t is None:  # one EC2 took meanwhile stays gone: the ready wait sees it
                    n.state, n.exit_code = "READY", None
            self.gang = {**survivors, **spares.join(self, nodes, spare_ranks, plan.promoted, attempt)}
            self.attempt, self.excluded = attempt, set()
            self.attempt_pool, self.attempt_start = sp, self.now
            self.attempts.append(Attempt(number=attempt, pool=sp.pool, started_at=self.now, world_size=world))
            self.decisions.append({"attempt": attempt, "pool": sp.key, "resumed_from_step": self.ckpt_step})
            return Launched(attempt=attempt, pool=sp.pool, price_per_hour=candidate.price_per_hour,
                            nodes=len(self.gang), world_size=world,
                            review_s=review_seconds(self.spec, self.timings)).model_dump(mode="json")
        self.excluded |= set(failed)
        raise TaskFailed("InsufficientCapacityError", f"no capacity in {len(failed)} pools")

    def task_recover(self, payload: dict[str, Any]) -> dict[str, Any]:
        """recovery_flow.recover: take the settled AttemptEnd, charge the budget, plan the strategy."""
        end = AttemptEnd.model_validate(payload.get("outcome") or {})
        if end.deadline is None:
            if self.running:  # a verdict that ends a running attempt without a save
                self.stop_training(self.committed(self.now))
            self.epoch += 1
        # else: launch_at_notice, the ranks keep training and save by the deadline (_exit_all)
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
            decision = check_retry_budget(self.spec.recovery, end, self.recoveries, self.user_restarts)
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
        if self.attempts and self.attempts[-1].ended_at is None:
            self.attempts[-1] = self.attempts[-1].model_copy(update={"ended_at": self.now})
        quotes = self._quotes()
        stats = self.stats.get_many(p.key for p in self.market.pools)
        try:
            plan = plan_recovery(RecoveryContext(spec=self.spec, outcome=end, nodes=nodes, quotes=quotes,
                                                 stats=stats, now=self.now, excluded=frozenset(self.excluded),
                                                 config=self.config, **self.context_extra))
            keep, action, home = list(plan.keep_instance_ids), RecoveryAction(plan.action), plan.pool
        except NoPlacementError:
            pass
        if end.outcome is Verdict.USER_ERROR and action is not RecoveryAction.NEW_CLUSTER:
            keep, action = [], RecoveryAction.NEW_CLUSTER
        spares.on_recover(self, home if action is not RecoveryAction.NEW_CLUSTER else None, nodes, keep)
        for node in list(self.gang.values()):
            if node.instance_id not in keep and not (end.deadline is not None and node.state == "DOOMED"):
                self.end_node(node)  # (a doomed node drains: it saves until EC2 takes it)
        if action is RecoveryAction.NEW_CLUSTER and current is not None and end.outcome in (
                Verdict.INTERRUPTED, Verdict.NODE_LOST, Verdict.INFRA_ERROR):
            self.excluded.add(current.key)
        self.recoveries, self.user_restarts = decision.recoveries, decision.user_restarts
        records = self._records()
        self.gang = {n.rank: n for n in self.gang.values() if n.end_t is None and n.instance_id in keep}
        self.note(current.key if current else "", f"recover: {end.outcome.value}, {action.value}")
        result = recovery_result(self._light_job(), records, self.timings, end, end.reason, spares.records(self))
        return result.model_dump(mode="json")

    def task_review(self, payload: dict[str, Any]) -> dict[str, Any]:
        return moves.review(self, payload)

    def task_migrate(self, move: AttemptEnd) -> dict[str, Any]:
        return moves.migrate(self, move)

    def task_teardown(self, payload: dict[str, Any]) -> dict[str, Any]:
        self.release_all()
        return {"terminated": []}

    def task_finalize(self, payload: dict[str, Any]) -> dict[str, Any]:
        return {"status": payload.get("result"), "changed": True}
