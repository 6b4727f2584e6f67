"""spotrelay's controller in the simulator: the job-run ASL walked state by state, its tasks served
by the shipped decisions through in-memory state.

- Plan/Provision/Recover call placement (``evaluate_pools``/``rank_pools``), the pool stats store and
  its cooldowns (``InMemoryPoolStatsStore``), ``classify_nodes``, ``check_retry_budget``,
  ``plan_recovery`` and ``backoff_seconds`` exactly as the Lambdas do (spotrelay/services/
  workflow_tasks.py and recovery_flow.py); the glue between them follows those services line by
  line and names them where it does. That glue is in ``sim/recover.py`` (Plan, Provision, Recover)
  and ``sim/moves.py`` (Review, Migrate); the task methods here delegate to it.
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
from spotrelay.contracts.recovery import AttemptEnd, Verdict
from spotrelay.contracts.workflow import WorkflowTimings
from spotrelay.domain.cost import leave_to_ec2
from spotrelay.domain.models import Attempt, Earlier, Job, Node
from spotrelay.domain.status import JobStatus
from spotrelay.placement import CooldownPolicy, PoolEvent
from spotrelay.placement.policy import DEFAULT_CONFIG
from spotrelay.services import handover
from spotrelay.services.waits import outcome_verdict, ready_verdict
from spotrelay.sim import attempts, moves, recover, spares
from spotrelay.sim.asl import Await, Finished, Sleep, Walker, load_asl
from spotrelay.sim.engine import HORIZON_S, Run
from spotrelay.sim.job import JobModel
from spotrelay.sim.market import Market
from spotrelay.sim.moves import SAVE_MARGIN_S
from spotrelay.sim.node_records import gang_records, template_for
from spotrelay.sim.quotes import LazyQuotes
from spotrelay.sim.records import Fault, SimNode
from spotrelay.sim.shortlist import Shortlist, SimPoolStats
from spotrelay.spec.models import JobSpec

_ASL_CACHE: dict[str, Any] = {}
_GONE = frozenset({"DOOMED", "LOST", "TERMINATED", "EXITED"})  # a node that went away (no ready verdict waits)
_WORKING = frozenset({"READY", "RUNNING"})  # every node so: the outcome wait has no verdict


class SpotrelayRun(Run):
    def __init__(self, market: Market, job: JobModel, seed: int, *, regions: list[str], instance_types: list[str],
                 timings: WorkflowTimings | None = None, cooldown: CooldownPolicy | None = None,
                 asl: dict[str, Any] | None = None, rebalance_checkpoint: bool = True,
                 markets: tuple[str, ...] = ("spot", "on-demand"), spec: JobSpec | None = None,
                 spec_overrides: dict[str, dict[str, Any]] | None = None, keep_margin: float | None = None,
                 start_t: float = 0.0, horizon_s: float = HORIZON_S, timeline: bool = False,
                 faults: tuple[Fault, ...] = ()) -> None:
        # (Run's arguments by name, not ``**kw``: mypyc passes a ``**kw`` on positionally, spotrelay/sim_native.py)
        super().__init__(market, job, seed, start_t, horizon_s, timeline, faults)
        self.spec = spec or job.spec(regions, instance_types, list(markets))
        if spec_overrides:  # switches on the spec: resources.spares, recovery.launch_at_notice, ...
            doc = self.spec.model_dump(mode="json")
            for section, values in spec_overrides.items():
                doc[section] = {**doc.get(section, {}), **values}
            self.spec = JobSpec.model_validate(doc)
        self._spec_doc = self.spec.model_dump(mode="json")
        self._verdict_job: Job | None = None  # _job's record of the current attempt
        self.timings = timings or WorkflowTimings()
        self.stats = SimPoolStats(cooldown)  # InMemoryPoolStatsStore (None: the shipped CooldownPolicy())
        self.config = DEFAULT_CONFIG  # what the services use; sweeping it means changing the default
        self.rebalance_checkpoint = rebalance_checkpoint
        # RecoveryContext's keep_margin (None: its default, what recover uses); a sweep, not a decision
        self.context_extra: dict[str, Any] = {} if keep_margin is None else {"keep_margin": keep_margin}
        self.attempt = 0
        self.recoveries = self.user_restarts = 0
        self.stalled = self.progress_step = 0  # the retry budget's stall count (recovery/budget.stall)
        self.excluded: set[str] = set()
        self.attempt_pool: Any = None
        self.attempt_start = 0.0
        self.created_at = 0.0  # the job record's created_at (start)
        # the attempts before the newest attempts.PLAN_ATTEMPTS, folded (attempts.light_job)
        self.folded: Earlier | None = None
        self.folded_n = 0
        self.attempts: list[Attempt] = []  # what the job record's attempts say (sim/attempts.py)
        self.cost_so_far = 0.0  # the job record's: its closed attempts' cost (sim/budget.py reads it)
        self.drained_usd = 0.0  # of which, instances billed past their attempt's close (sim/attempts.outlived)
        self.stop_pending = False  # the ranks save for the budget's stop (sim/budget.py): no verdicts meanwhile
        self.budget_watch = 0  # the budget's current watch (sim/budget.py): an older one's events do nothing
        self.seg_attempt = 0  # the attempt whose ranks train the current segment
        self.noticed: set[str] = set()  # instances that got a notice (interruption_notice sets reclaim_at)
        self.ec2_noticed: set[str] = set()  # EC2 noticed (in the gang or not) or took unannounced: ec2_reclaim_at
        self.voluntary: dict[str, float] = {}  # instance id -> a review's save deadline (its reclaim_at)
        self.draining: list[SimNode] = []  # released by the workflow, still saving: end at their exit
        self.waiting: str | None = None
        self.wait_epoch = 0
        self.ready_pending = 0
        self.short_starts = 0  # trainings started with fewer ranks than the gang (should stay 0)
        self.ready_attempt = 0  # the attempt whose gang the ready wait last found READY (its START sent)
        self.decisions: list[dict[str, Any]] = []  # attempt, pool, resumed_from (calibration)
        self._node_template: Node | None = None
        self.shortlist = Shortlist()  # sim/shortlist.py's per-pool score bounds for reviews
        self.stay_answer: tuple[int, dict[str, Any]] = (-1, {})  # moves._stay's, per attempt
        # moves._price_mark's mark and until when it holds (no pool's price changes before then)
        self.price_mark_memo: tuple[float, str] = (-float("inf"), "")
        self.mark_pools: list[Any] | None = None  # moves._price_mark's pools: the spec's
        self.mark_entries: list[tuple[float, str]] = []  # and each one's (price, part of the mark)
        self.last_review: tuple[Any, ...] | None = None  # shortlist.same_review's inputs and answer
        self.stint_memo: tuple[int, float | None] | None = None  # moves._stints': (attempts seen, answer)
        if asl is None:
            asl = _ASL_CACHE.get("job_run") or _ASL_CACHE.setdefault("job_run", load_asl())
        self.asl = asl
        self.handed_over: dict[str, Any] | None = None  # the next execution's input (task_handover)
        self.executions = 1  # the job's workflow executions so far (services/handover.py)
        self.walker = self._walker({"job_id": "sim", "timings": self.timings.model_dump()})

    # --- driving the walker ---------------------------------------------------------------------
    def _walker(self, data: dict[str, Any]) -> Walker:
        return Walker(self.asl, {
            "fn_sfn_plan": self.task_plan, "fn_sfn_provision": self.task_provision,
            "fn_sfn_recover": self.task_recover, "fn_sfn_teardown": self.task_teardown,
            "fn_sfn_review": self.task_review, "fn_sfn_handover": self.task_handover,
            "fn_sfn_finalize": self.task_finalize,
        }, data)

    def drop_links(self) -> None:
        self.walker.handlers.clear()  # (its handlers are this run's bound methods)

    def start(self) -> None:
        self.created_at = self.now
        self.at(self.now, self._step, None)

    def _step(self, result: Any) -> None:
        self._handle(self.walker.resume(result))

    def _handle(self, what: Sleep | Await | Finished) -> None:
        if isinstance(what, Sleep):
            self.at(self.now + what.seconds, self._step, None)
        elif isinstance(what, Await):
            self.waiting = what.wait
            self.wait_epoch += 1
            if what.timeout_s is not None:  # (the outcome wait's timeout is the review's next poll)
                at = moves.next_poll_at(self, what.timeout_s) if what.wait == "outcome" else self.now + what.timeout_s
                self.at(at, self._timeout, self.wait_epoch)
            self._settle()
        elif what.failed:
            self.metrics.failed_reason = self.metrics.failed_reason or f"job failed ({what.state})"
        elif what.state == "HandedOver" and self.handed_over is not None:  # the next execution goes on
            data, self.handed_over = self.handed_over, None
            self.walker.handlers.clear()
            self.walker = self._walker(data)
            self.executions += 1
            self._handle(self.walker.advance())
        else:
            self.finish()

    def fail_wait(self, error: str) -> None:
        """The registered wait's token fails with ``error`` (SendTaskFailure: the reconcile's budget)."""
        self.wait_epoch += 1
        self._handle(self.walker.resume(error=error))

    def _timeout(self, epoch: int) -> None:
        if self.waiting is not None and epoch == self.wait_epoch and not self.stop_pending:
            self.waiting = None
            self._handle(self.walker.resume(error="States.Timeout"))

    def _records(self) -> list[Node]:
        if self._node_template is None:
            self._node_template = template_for(self.market.pools[0].pool)
        return gang_records(self._node_template, self.gang.values(), self.attempt, self.noticed, self.voluntary)

    def _job(self) -> Job:
        """The record the waits' verdicts read (its attempt and spec), made once per attempt: a settle
        comes with each node's boot and notice, and the verdicts only read it."""
        if self._verdict_job is None or self._verdict_job.attempt != self.attempt:
            self._verdict_job = Job(job_id="sim", name="sim", status=JobStatus.RUNNING, attempt=self.attempt,
                                    spec=self._spec_doc)
        return self._verdict_job

    def _settle(self) -> None:
        """waits.settle: deliver the verdict of the registered wait once the node records give one."""
        if self.waiting is None or self.stop_pending:  # (the ranks save for a stop: sim/budget.py)
            return
        states = {n.state for n in self.gang.values()}  # (a boot of each of 32 nodes asks: one pass)
        if self.waiting == "ready":
            if "PENDING" in states and states.isdisjoint(_GONE):
                return  # still booting and nothing went away: no verdict yet (skip building records)
            verdict = ready_verdict(self._job(), self._records())
        else:
            if states <= _WORKING:
                return
            verdict = outcome_verdict(self._job(), self._records())
        if verdict is None:
            return
        self.waiting = None
        if verdict.outcome is Verdict.READY:
            self.ready_attempt = self.attempt
            self.at(self.now + self.job.restore_s(), self._train, self.epoch)
        self._handle(self.walker.resume(verdict.model_dump(mode="json")))

    # --- market and agent events (the event handlers' effect on the records) --------------------
    def checkpoint_every_steps(self, instance_type: str) -> int:
        """The spec's cadence (``every_minutes: auto``: from the attempt's loss interval)."""
        loss = self.attempts[-1].loss_interval_s if self.attempts else None
        return self.job.spec_every_steps(self.spec.checkpoint, instance_type, loss)

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
        self.seg_attempt = self.attempt
        attempts.resumed(self, self.attempt, self.ckpt_step)  # TrainingResumed
        self.start_training(info.pool.instance_type, info.gpus * len(self.gang), world=world)
        self.note(info.key, f"training from step {self.ckpt_step}")

    def stop_training(self, resume_from: int) -> None:
        """The engine's, and the segment's attempt records the newest checkpoint its ranks committed
        (CheckpointCommitted: a periodic one, or the notice's or a move's save)."""
        if self.running:
            saved = min(resume_from, int(self.step_at(self.now) + 1e-6))
            if saved > self.seg_step0:
                attempts.saved(self, self.seg_attempt, saved, min(attempts.commit_t(self, saved), self.now))
        super().stop_training(resume_from)

    def on_booted(self, node: SimNode) -> None:
        self._settle()

    def on_notice(self, node: SimNode) -> None:
        """interruptions.interruption_notice: count it, doom the node, every rank saves late."""
        if spares.off_bench(self, node):  # a spare only leaves the bench
            return
        self.ec2_noticed.add(node.instance_id)
        self.stats.record(node.pool.key, PoolEvent.INTERRUPTED, self.now)
        if node.rank not in self.gang or self.gang[node.rank] is not node or node.state in ("LOST", "TERMINATED"):
            return
        self.noticed.add(node.instance_id)
        if node.state not in ("DOOMED", "EXITED"):
            node.state = "DOOMED"
        self.note(node.pool.key, f"notice rank {node.rank}")
        if self.running and node in self.seg_nodes:
            flush = self.job.flush_s()
            save_t = max(self.now, node.removal_t - flush - SAVE_MARGIN_S)
            commit_t = save_t + flush
            saved = commit_t <= node.removal_t
            if not saved:  # the agent's deadline-at-risk: its save takes longer than the notice leaves
                attempts.notice_at_risk(self, node.attempt)
            step = int(self.step_at(save_t) + 1e-6)
            self.at(commit_t if saved else node.removal_t, self._exit_all,
                    (self.epoch, step if saved else None, self.attempt))
            self._settle()  # with launch_at_notice the outcome wait ends now, with the deadline
        elif self.waiting == "outcome" and not self.running:  # ready, still restoring: nothing new to save,
            self._exit_all((self.epoch, self.ckpt_step, self.attempt))  # the ranks stop
        else:  # booting, or a new gang coming up while the last one trains to its save (which goes on):
            self._settle()  # the waits decide, as in the services

    def _exit_all(self, arg: tuple[int, int | None, int]) -> None:
        """The ranks of ``attempt`` committed their save (``step``; None: it missed the reclaim) and exit.
        With launch_at_notice the workflow has already moved on: survivors kept for the next attempt
        keep their instances, and the new gang trains from this save once it is ready."""
        epoch, step, attempt = arg
        if epoch != self.epoch:  # the segment stopped before this save came (one of its ranks was lost)
            self._release_drained()
            self._start_ready_gang(attempt)  # that stop voided the new gang's pending start too
            return
        if self.running:
            self.stop_training(step if step is not None else self.committed(self.now))
        else:
            self.epoch += 1  # the pending start of training is off
        code = ExitCode.PREEMPTED_SAVED if step is not None else ExitCode.PREEMPTED_UNSAVED
        for n in self.gang.values():
            if n.attempt == attempt and n.state not in ("LOST", "TERMINATED"):
                n.state, n.exit_code = "EXITED", int(code)
        self._release_drained()
        self._start_ready_gang(attempt)
        self._settle()

    def _start_ready_gang(self, attempt: int) -> None:
        """The new gang was ready before ``attempt``'s ranks were done: it trains after its restore.
        Only a gang the ready wait found READY: survivors a recovery kept while Plan or Provision is
        still getting their replacements are READY too, but nothing told them to start (they started
        short of ranks: a gang that would hang at its rendezvous)."""
        if attempt != self.attempt and self.ready_attempt == self.attempt and not self.running and self.gang and all(
                n.state == "READY" for n in self.gang.values()):
            self.at(self.now + self.job.restore_s(), self._train, self.epoch)

    def _release_drained(self) -> None:
        """Ranks the workflow let drain (a move's leaving ones, survivors a recovery dropped mid-save)
        exit once the segment they saved for has stopped: released. (By that, not by attempt: a kept
        survivor carries the new attempt's number while it saves for the old one.)"""
        training = self.seg_nodes if self.running else ()
        for n in [n for n in self.draining if n not in training]:
            self.draining.remove(n)
            if n.end_t is None:
                n.state, n.exit_code = "EXITED", int(ExitCode.PREEMPTED_SAVED)
                self.release(n, "EXITED")

    def release(self, node: SimNode, state: str = "TERMINATED") -> None:
        """controller.release_nodes: terminated now, or, noticed by EC2 in its first hour, left for
        EC2 to take (its interruption is not billed): it keeps its place in the pool until then."""
        if node.end_t is None and not node.left_to_ec2 and leave_to_ec2(
                node.pool.pool.market, node.launch_t, node.removal_t if node.instance_id in self.ec2_noticed else None):
            node.left_to_ec2, node.state = True, state
            return
        if node.end_t is None and (node.attempt != self.attempt or self.attempts[-1].ended_at is not None):
            attempts.outlived(self, node)  # (a node of the open attempt: its clock runs, nothing to charge)
        self.end_node(node, state)

    def on_rebalance(self, node: SimNode) -> None:
        """interruptions.rebalance: a proactive checkpoint (and a standby, with prewarm) while the job
        runs; none for a new gang's node while the last gang trains to its save (the job is not
        RUNNING then: the services ignore the recommendation)."""
        if not self.running or self.gang.get(node.rank) is not node or node not in self.seg_nodes:
            return
        if self.rebalance_checkpoint:
            self.force_checkpoint(self.now, self.now + self.job.persist_s() + self.job.stall_s(
                node.pool.pool.instance_type))
        ask = spares.request_standby(self, node)
        if ask is not None:  # the outcome wait ends with REBALANCE: the ASL's Prewarm boots a standby
            self.waiting = None
            self._handle(self.walker.resume(ask.model_dump(mode="json")))

    def _removed(self, node: SimNode) -> None:
        """interruptions.instance_state: a spot node of the attempt lost without a notice (neither
        DOOMED nor EXITED) that EC2 took, not a crash (its StateReason, Compute.spot_reclaimed), gets
        EC2's reclaim time as a noticed one does: the ledger leaves out its unbilled first hour."""
        if (node.end_t is None and not node.announced and not node.crashed and node.pool.spot
                and node.state not in ("DOOMED", "EXITED") and self.gang.get(node.rank) is node
                and node.attempt == self.attempt):
            self.ec2_noticed.add(node.instance_id)
        super()._removed(node)

    def on_removed(self, node: SimNode, announced: bool) -> None:
        if spares.off_bench(self, node) or self.gang.get(node.rank) is not node:
            return
        if self.running:  # (unannounced, or its save never came)
            # a rank of the training gang stopped it already (end_node); a new gang's node, lost while it
            # boots as the last gang trains to its save, leaves that save alone
            node.state = "LOST"
            self.note(node.pool.key, f"rank {node.rank} lost while a gang trains")
        self._settle()

    def overlapping(self) -> bool:
        """Whether the training gang is not the current one: with launch_at_notice (or a move) the next
        gang boots or restores while the last one trains to the save already set for it. As in the
        services (recovery_flow works on the current attempt's nodes; the last one's drain), what
        befalls the new gang does not stop that save."""
        return self.running and any(self.gang.get(n.rank) is not n for n in self.seg_nodes)

    def on_training_done(self) -> None:
        for n in self.gang.values():
            if n.state not in ("LOST", "TERMINATED"):
                n.state, n.exit_code = "EXITED", int(ExitCode.DONE)
        self._settle()

    # --- the ASL's tasks ------------------------------------------------------------------------
    def _quotes(self) -> list[Any]:
        """The MarketData port's answer, placement scores sized for the launch as the services ask."""
        res = self.spec.resources
        return self.market.quotes(self.now, res.nodes + res.spares, {k: len(v) for k, v in self.held.items()})

    def _quotes_for(self, count: int) -> LazyQuotes:
        """The MarketData port's quotes with scores sized for ``count`` nodes (recover asks for the lost
        ranks; it reads them up to the survivors' pool, so they are made as they are read)."""
        return LazyQuotes(self.market, self.now, count, {k: len(v) for k, v in self.held.items()})

    def task_plan(self, payload: dict[str, Any]) -> dict[str, Any]:
        return recover.plan(self, payload)

    def task_provision(self, payload: dict[str, Any]) -> dict[str, Any]:
        return recover.provision(self, payload)

    def task_recover(self, payload: dict[str, Any]) -> dict[str, Any]:
        return recover.recover(self, payload)

    def task_review(self, payload: dict[str, Any]) -> dict[str, Any]:
        return moves.review(self, payload)

    def task_migrate(self, move: AttemptEnd) -> dict[str, Any]:
        return moves.migrate(self, move)

    def task_teardown(self, payload: dict[str, Any]) -> dict[str, Any]:
        self.release_all()
        return {"terminated": []}

    def task_handover(self, payload: dict[str, Any]) -> dict[str, Any]:
        """services/handover.hand_over: the next execution's input (started when this one succeeds)."""
        self.handed_over, generation = handover.next_input(payload["data"], payload["resume_at"])
        return {"execution_arn": f"sim-h{generation}", "generation": generation}

    def task_finalize(self, payload: dict[str, Any]) -> dict[str, Any]:
        return {"status": payload.get("result"), "changed": True}
