"""Property tests of the controller (hypothesis, stateful): one job's real job-run ASL, interpreted
step by step (the simulator's interpreter, driven by asl_runner), against the real services over
in-memory ports, while EC2 events, agent events, duplicated workflow tasks, timeouts, cancels and
reconcile ticks arrive in any order, twice, late or never. Dropped events are the ones the strategy never draws.

After every step:
- the job moved only along the documented transition table (spotrelay.domain.status.TRANSITIONS);
- at most one attempt is open, each attempt number was launched at most once (no duplicate
  cluster), and every live instance of the job belongs to its current attempt (or was doomed);
- every task token got at most one answer (a retried task repeating the same answer is refused by
  Step Functions and harmless; two different answers are a race);
- the recorded last checkpoint never moved backwards;
- a node record's state only moved forward (PENDING -> READY/RUNNING -> DOOMED -> EXITED ->
  LOST/TERMINATED): the controller's handlers are its one writer and no late event undoes it;
- the job's MLflow run id, once recorded, never changed;
- every node of a finished job is terminated: no live instance, no node record in a live state.
At the end a well-behaved agent and EC2 drive the run to its end: the job must finish (no hang),
with every node terminated and no instance left.

500 examples, derandomized, so ``make test`` is the same every run; ``HYPOTHESIS_PROFILE=explore``
draws new ones.
"""

from __future__ import annotations

import json
import os
import uuid
from collections import Counter
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from pydantic import BaseModel

from spotrelay.adapters.memory_job_store import MemoryJobStore
from spotrelay.contracts.events import (
    CheckpointCommitted,
    DirectiveSeen,
    Heartbeat,
    NodeReady,
    NoticeSeen,
    TrackingStarted,
    TrainingExited,
    TrainingStarted,
)
from spotrelay.contracts.exit_codes import ExitCode
from spotrelay.contracts.workflow import WorkflowInput, WorkflowTimings
from spotrelay.domain.cost import leave_to_ec2
from spotrelay.domain.models import Job, Node, NodeState
from spotrelay.domain.status import JobStatus, can_transition
from spotrelay.errors import SpotrelayError
from spotrelay.placement import InMemoryPoolStatsStore
from spotrelay.services import interruptions, node_events, plan, reconcile, recovery_flow, waits, workflow_tasks
from spotrelay.services.cancel import request_cancel
from spotrelay.services.controller import Controller
from spotrelay.services.prewarm import prewarm
from spotrelay.services.task_payloads import FinalizeTask, PlanTask, ProvisionTask, RecoverTask, RegisterWaitTask
from tests.integration.asl_runner import AslWorkflow, Execution, TaskError
from tests.integration.controller_doubles import QuotedMarket, ScriptedCompute, new_job

settings.register_profile(
    "default", max_examples=500, stateful_step_count=20, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
settings.register_profile("debug", parent=settings.get_profile("default"),
                          report_multiple_bugs=False)
settings.register_profile("explore", parent=settings.get_profile("default"), derandomize=False, max_examples=2000,
                          report_multiple_bugs=False)
PROFILE = settings.get_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
JOB = "job-under-test"
EXIT_CODES = [ExitCode.DONE, ExitCode.PREEMPTED_SAVED, ExitCode.PREEMPTED_UNSAVED, ExitCode.USER_ERROR,
              ExitCode.INFRA_ERROR, ExitCode.CANCELLED]
_FINAL = (NodeState.TERMINATED, NodeState.LOST, NodeState.EXITED)
# the order a node record's state may move in (equal ranks may follow each other)
_RANK = {NodeState.PENDING: 0, NodeState.READY: 1, NodeState.RUNNING: 1, NodeState.DOOMED: 2, NodeState.EXITED: 3,
         NodeState.LOST: 4, NodeState.TERMINATED: 4}


class WatchedStore(MemoryJobStore):
    """The in-memory store, recording every job write that leaves the transition table."""

    def __init__(self) -> None:
        super().__init__()
        self.illegal: list[str] = []

    def save_job(self, job: Job, expected_status: JobStatus, expected_version: int) -> Job:
        saved = super().save_job(job, expected_status, expected_version)
        if job.status is not expected_status and not can_transition(expected_status, job.status):
            self.illegal.append(f"{expected_status} -> {job.status}")
        return saved


def _capacity(fails: int) -> Any:
    """The first ``fails`` launches anywhere find no capacity (every pool, for a while)."""
    from tests.integration.controller_doubles import CAPACITY

    return lambda pool, n: CAPACITY if n < fails else None


class ControllerRun(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.store = WatchedStore()
        self.workflow = AslWorkflow()
        self.compute = ScriptedCompute()
        self.ctl = Controller(store=self.store, workflow=self.workflow, compute=self.compute,
                              market=QuotedMarket(), pool_stats=InMemoryPoolStatsStore())
        self.now = 1_000_000.0
        self.delivered: list[Any] = []  # every event delivered so far (for duplicates and late replays)
        self.best_checkpoint = -1
        self.node_ranks: dict[str, int] = {}  # node id -> the furthest state rank seen
        self.run_id: str | None = None
        self.timings = WorkflowTimings(ready_timeout_s=600, heartbeat_s=600, backoff_s=5, backoff_max_s=60,
                                       provision_retry_s=5)

    # --- set-up -------------------------------------------------------------------------------
    @initialize(nodes=st.integers(1, 3), fails=st.integers(0, 4), strategy=st.sampled_from(
        ["replace-cluster", "replace-lost-nodes"]))
    def submit(self, nodes: int, fails: int, strategy: str) -> None:
        self.compute._fail = _capacity(fails)
        job = new_job(self.store, job_id=JOB, status=JobStatus.VALIDATED, strategy=strategy)
        # spot_wait_minutes 0: the unset default waits up to 2 h of the clock for spot after failed
        # launches (placement/spot_wait.py, tested there); these runs check the workflow's invariants
        spec = dict(job.spec, resources={**job.spec["resources"], "nodes": nodes},
                    recovery={**job.spec.get("recovery", {}), "spot_wait_minutes": 0})
        arn = self.workflow.start(JOB, {})
        self.store.update_job(JOB, lambda j: j.model_copy(update={"spec": spec, "execution_arn": arn,
                                                                  "created_at": self.now, "updated_at": self.now}))
        data = WorkflowInput(job_id=JOB, timings=self.timings).model_dump(mode="json")
        self.workflow.execution = Execution(data, self._invoke)

    # --- the Lambda tasks, as the handlers call them --------------------------------------------
    def _invoke(self, name: str, payload: dict[str, Any]) -> Any:
        try:
            result = self._call(name, payload)
            return result.model_dump(mode="json") if isinstance(result, BaseModel) else result
        except SpotrelayError as exc:  # the handler's error type is the exception's class name
            raise TaskError(type(exc).__name__, json.dumps({"errorMessage": str(exc)})) from exc

    def _call(self, name: str, payload: dict[str, Any]) -> Any:
        ctl, now = self.ctl, self.now
        if name == "sfn_plan":
            plan_task = PlanTask.model_validate(payload)
            return plan.plan(ctl, plan_task.job_id, now, recovery=plan_task.recovery)
        if name == "sfn_provision":
            provision_task = ProvisionTask.model_validate(payload)
            if provision_task.standby is not None:  # the Prewarm state, as the handler routes it
                return prewarm(ctl, provision_task.job_id, provision_task.standby, now)
            assert provision_task.plan is not None
            return workflow_tasks.provision(ctl, provision_task.job_id, provision_task.plan, now)
        if name == "sfn_register_wait":
            wait = RegisterWaitTask.model_validate(payload)
            return waits.register_wait(ctl, wait.job_id, wait.wait, wait.attempt, wait.task_token, now)
        if name == "sfn_recover":
            recover_task = RecoverTask.model_validate(payload)
            return recovery_flow.recover(ctl, recover_task.job_id, recover_task.outcome, recover_task.timings, now)
        if name == "sfn_teardown":
            return workflow_tasks.teardown(ctl, payload["job_id"], now)
        if name == "sfn_finalize":
            final = FinalizeTask.model_validate(payload)
            return workflow_tasks.finalize(ctl, final.job_id, final.result, now, error=final.error)
        raise AssertionError(f"the ASL names an unknown function {name}")

    # --- helpers --------------------------------------------------------------------------------
    @property
    def execution(self) -> Execution:
        assert self.workflow.execution is not None
        return self.workflow.execution

    def _job(self) -> Job:
        return self.store.get_job(JOB)

    def _node(self, index: int) -> Node | None:
        nodes = self.store.nodes_of(JOB)
        return nodes[index % len(nodes)] if nodes else None

    def _deliver(self, event: Any) -> None:
        self.delivered.append(event)
        self._apply(event)

    def _apply(self, event: Any) -> None:
        if isinstance(event, tuple):  # an EC2 event: (kind, instance id, event time)
            kind, iid, when = event
            if kind == "notice":
                interruptions.interruption_notice(self.ctl, iid, when, self.now)
            elif kind == "rebalance":
                interruptions.rebalance(self.ctl, iid, when, self.now)
            else:
                interruptions.instance_state(self.ctl, iid, kind, self.now)
        else:
            node_events.handle_agent_event(self.ctl, event, self.now)

    def _agent(self, cls: type, node: Node, attempt: int | None = None, **fields: Any) -> Any:
        return cls(event_id=uuid.uuid4().hex, job_id=node.job_id, node_id=node.node_id,
                   instance_id=node.instance_id, attempt=attempt or node.attempt, rank=node.rank,
                   time=self.now, **fields)

    # --- what may happen, in any order ----------------------------------------------------------
    @rule(duplicate=st.booleans())
    def workflow_step(self, duplicate: bool) -> None:
        self.execution.step(duplicate=duplicate)

    @rule()
    def wait_times_out(self) -> None:
        self.execution.time_out()

    @rule(seconds=st.sampled_from([1.0, 30.0, 400.0, 4000.0]))
    def clock(self, seconds: float) -> None:
        self.now += seconds

    @rule(seconds=st.sampled_from([0.0, 400.0]))
    def reconcile_tick(self, seconds: float) -> None:
        self.now += seconds  # reconcile late
        reconcile.reconcile(self.ctl, self.now, stale_after_s=300.0, regions=["us-east-1"], stuck_after_s=3600.0)

    @rule(index=st.integers(0, 8), kind=st.sampled_from(["NodeReady", "Heartbeat", "CheckpointCommitted",
                                                          "TrainingExited"]),
          stale=st.booleans(), step=st.integers(0, 40), code=st.sampled_from(EXIT_CODES), emergency=st.booleans())
    def agent_event(self, index: int, kind: str, stale: bool, step: int, code: int, emergency: bool) -> None:
        node = self._node(index)
        if node is None:
            return
        attempt = max(1, node.attempt - 1) if stale else node.attempt
        if kind == "NodeReady":
            event = self._agent(NodeReady, node, attempt, private_ip="10.0.0.1", region="us-east-1",
                                az=node.pool.az)
        elif kind == "Heartbeat":
            event = self._agent(Heartbeat, node, attempt, step=step)
        elif kind == "CheckpointCommitted":
            event = self._agent(CheckpointCommitted, node, attempt, step=step, uri=f"s3://b/ckpt/step-{step}",
                                duration_s=1.0, emergency=emergency)
        else:
            event = self._agent(TrainingExited, node, attempt, exit_code=int(code), reason="test",
                                last_step=step, last_committed_step=None)
        self._deliver(event)

    @rule(index=st.integers(0, 8), kind=st.sampled_from(["TrainingStarted", "NoticeSeen", "DirectiveSeen",
                                                          "TrackingStarted"]),
          stale=st.booleans(), own=st.booleans(), run=st.integers(0, 2))
    def agent_report(self, index: int, kind: str, stale: bool, own: bool, run: int) -> None:
        """What the agent reports instead of writing its node item (its port's events)."""
        node = self._node(index)
        if node is None:
            return
        attempt = max(1, node.attempt - 1) if stale else node.attempt
        if kind == "TrainingStarted":
            event = self._agent(TrainingStarted, node, attempt)
        elif kind == "NoticeSeen":
            event = self._agent(NoticeSeen, node, attempt, action_time=self.now + 120.0)
        elif kind == "DirectiveSeen":
            directive_id = (node.directive or {}).get("directive_id", "none") if own else "another"
            event = self._agent(DirectiveSeen, node, attempt, directive_id=directive_id)
        else:
            event = self._agent(TrackingStarted, node, attempt, mlflow_run_id=f"run-{run}")
        self._deliver(event)

    @rule(index=st.integers(0, 8), kind=st.sampled_from(["notice", "rebalance", "shutting-down", "terminated"]),
          dies=st.booleans())
    def ec2_event(self, index: int, kind: str, dies: bool) -> None:
        node = self._node(index)
        if node is None:
            return
        if kind in ("shutting-down", "terminated") or dies:
            self.compute.live.pop(node.instance_id, None)  # the instance really goes
        self._deliver((kind, node.instance_id, self.now))

    @rule(index=st.integers(0, 8), saved=st.booleans())
    def notice_then_every_rank_exits(self, index: int, saved: bool) -> None:
        """EC2's notice for one node, then the ranks of its attempt save (or not) and exit: its release
        comes while its reclaim is in its first hour, so it is left to EC2 (the random rules rarely
        line these up)."""
        node = self._node(index)
        if node is None:
            return
        self._deliver(("notice", node.instance_id, self.now))
        code = ExitCode.PREEMPTED_SAVED if saved else ExitCode.PREEMPTED_UNSAVED
        for each in self.store.nodes_of(JOB):
            if each.attempt == node.attempt and not each.spare:
                self._deliver(self._agent(TrainingExited, each, each.attempt, exit_code=int(code), reason="test",
                                          last_step=10, last_committed_step=None))

    @rule(index=st.integers(0, 8))
    def instance_vanishes(self, index: int) -> None:
        """An unannounced loss whose events are all dropped: only reconcile can notice."""
        node = self._node(index)
        if node is not None:
            self.compute.live.pop(node.instance_id, None)

    @rule(back=st.integers(1, 6))
    def replay(self, back: int) -> None:
        """A duplicate, late or out-of-order delivery of an earlier event."""
        if self.delivered:
            self._apply(self.delivered[-min(back, len(self.delivered))])

    @rule()
    def cancel(self) -> None:
        if not self._job().status.terminal:
            request_cancel(JOB, store=self.store, workflow=self.workflow, now=self.now, reason="property test")

    # --- invariants -------------------------------------------------------------------------------
    @invariant()
    def moves_only_along_the_table(self) -> None:
        assert self.store.illegal == []

    @invariant()
    def one_live_attempt(self) -> None:
        job = self.store.find_job(JOB)
        if job is None:
            return
        assert sum(a.ended_at is None for a in job.attempts) <= 1, job.attempts
        launches = Counter((r.job_id, r.attempt) for r in self.compute.launched)
        assert max(launches.values(), default=0) <= 1, f"a cluster launched twice: {launches}"
        nodes = self.store.nodes_of(JOB)
        for iid in self.compute.running(JOB):
            mine = [n for n in nodes if n.instance_id == iid]
            newest = max(mine, key=lambda n: n.attempt) if mine else None
            assert newest is not None, f"instance {iid} has no node record"
            # (or released after EC2's notice in its first hour: left for EC2 to take, not billed)
            left = newest.state is NodeState.TERMINATED and leave_to_ec2(
                newest.pool.market, newest.launched_at, newest.ec2_reclaim_at)
            assert newest.attempt == job.attempt or newest.state is NodeState.DOOMED or left, (
                f"instance {iid} of attempt {newest.attempt} ({newest.state}) runs during attempt {job.attempt}")

    @invariant()
    def finished_job_has_every_node_terminated(self) -> None:
        job = self.store.find_job(JOB)
        if job is None or not job.status.terminal:
            return
        running = self.compute.running(JOB)
        assert running == [], f"job {job.status} but instances {running} still run"
        live = [(n.node_id, n.state) for n in self.store.nodes_of(JOB) if n.state not in _FINAL]
        assert live == [], f"job {job.status} but its node records say {live}"

    @invariant()
    def each_token_completed_once(self) -> None:
        # A retried task may repeat its own answer (Step Functions refuses the repeat); two different
        # answers for one token are a race that the conditional claim on the job must prevent.
        twice = {t: sorted(a) for t, a in self.workflow.sends.items() if len(a) > 1}
        assert not twice, f"tokens answered twice: {twice} by {[self.workflow.senders[t] for t in twice]}"

    @invariant()
    def checkpoint_never_moves_back(self) -> None:
        job = self.store.find_job(JOB)
        step = job.last_checkpoint.step if job and job.last_checkpoint else -1
        assert step >= self.best_checkpoint, f"last checkpoint went back from {self.best_checkpoint} to {step}"
        self.best_checkpoint = step

    @invariant()
    def node_state_only_moves_forward(self) -> None:
        for node in self.store.nodes_of(JOB):
            rank = _RANK[node.state]
            before = self.node_ranks.get(node.node_id, 0)
            assert rank >= before, f"node {node.node_id} moved back to {node.state} (rank {before} before)"
            self.node_ranks[node.node_id] = rank

    @invariant()
    def run_id_recorded_once(self) -> None:
        job = self.store.find_job(JOB)
        run_id = job.mlflow_run_id if job else None
        assert self.run_id is None or run_id == self.run_id, f"MLflow run id changed {self.run_id} -> {run_id}"
        self.run_id = run_id

    # --- the end: everything behaves, the run must finish cleanly --------------------------------
    def teardown(self) -> None:
        if self.workflow.execution is None:
            return
        for _ in range(200):
            job = self._job()
            if job.status.terminal and self.execution.status != "RUNNING":
                break
            self._behave()
        job = self._job()
        assert job.status.terminal, (f"job hangs in {job.status} (execution {self.execution.status} at "
                                     f"{self.execution.current}): {self.execution.history[-12:]}")
        assert self.execution.status != "RUNNING", f"execution hangs at {self.execution.current}"
        assert self.compute.running(JOB) == [], "instances left running after the job finished"
        reconcile.reconcile(self.ctl, self.now, regions=["us-east-1"])
        left = [n.node_id for n in self.store.nodes_of(JOB) if n.state is not NodeState.TERMINATED
                and n.instance_id in self.compute.live]
        assert left == []
        self.moves_only_along_the_table()
        self.each_token_completed_once()

    def _behave(self) -> None:
        """One round of a healthy world: nodes answer the open wait, dead instances' events arrive,
        the clock moves and reconcile runs."""
        execution = self.execution
        wait = execution.wait_kind()
        job = self._job()
        if wait is not None:
            for node in [n for n in self.store.nodes_of(JOB) if n.attempt == job.attempt]:
                if node.instance_id not in self.compute.live:
                    self._apply(("terminated", node.instance_id, self.now))
                elif wait == "ready":
                    self._apply(self._agent(NodeReady, node, private_ip="10.0.0.1", region="us-east-1",
                                            az=node.pool.az))
                elif node.state not in _FINAL:
                    self._apply(self._agent(TrainingExited, node, exit_code=0, reason="done",
                                            last_step=40, last_committed_step=40))
            if execution.wait_kind() == wait and execution.token is not None:
                execution.time_out()  # nothing answered it: the wait's timeout ends it
        else:
            execution.step()
        self.now += 30.0
        if execution.status != "RUNNING" or self._job().status.terminal:
            self.now += 4000.0
            reconcile.reconcile(self.ctl, self.now, regions=["us-east-1"])


ControllerRun.TestCase.settings = PROFILE
TestControllerProperties = ControllerRun.TestCase

