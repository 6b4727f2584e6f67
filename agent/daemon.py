"""The agent's daemon: one node's registration, launch, loop and exit.

register (NodeReady) -> wait for rank 0's address and port -> launch (TrainingStarted) ->
loop (detect, decide, act, follow the trainer, heartbeat) -> TrainingExited -> the node's exit
code; a surviving node may then be carried into the next gang. The agent talks to the controller
only through its port (spotrelay/contracts/agent.py): it reports events and reads what the
controller wrote; it writes no record. See docs/agent.md.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from agent.actions import Responder, classify_exit
from agent.config import AgentConfig
from agent.hang import HangWatch, dump_stacks
from agent.imds import ImdsClient
from agent.launcher import EXIT_DIR, LaunchPlan, Rendezvous, TrainingProcess, build_plan, contract_env
from agent.log_shipper import LogShipper, LogSink
from agent.monitors import DirectiveMonitor, Monitor, Notice, NoticeKind, RebalanceMonitor, SpotInterruptionMonitor
from agent.notice_store import NoticeStore
from agent.output_tail import bound, failure_tail
from agent.reporting import Reporter, info, warn
from agent.spare import Prefetch, wait_for_drain
from agent.succession import Succession, joined_config  # noqa: F401  (joined_config: re-exported)
from agent.tracking import JobTracking
from spotrelay.contracts import control
from spotrelay.contracts.agent import PENDING, AgentPort, JobView, NodeView, rank0_address
from spotrelay.contracts.exit_codes import ExitCode
from spotrelay.contracts.health import AnomalyKind, HealthAction, HealthAnomaly
from spotrelay.errors import AgentConfigError, ImdsUnavailableError, SpotrelayError
from spotrelay.spec.models import JobSpec

TICK_S = 0.25
REREGISTER_S = 10.0  # NodeReady again while the own record still says PENDING (a lost or early event)


class Agent(Succession):
    def __init__(
        self,
        config: AgentConfig,
        port: AgentPort,
        reporter: Reporter,
        imds: ImdsClient,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        plan_builder: Callable[[JobSpec, Rendezvous, dict[str, str], str | None, str], LaunchPlan] = build_plan,
        log_sink: LogSink | None = None,
    ) -> None:
        if config.durable_root is None:
            config = config.model_copy(update={"durable_root": port.durable_root()})
        reporter.config = config
        self.config, self.port, self.reporter, self.imds = config, port, reporter, imds
        self.plan_builder = plan_builder
        self.clock, self.sleep = clock, sleep
        self.control = config.control
        self.responder = Responder(self.control, reporter, clock)
        self.notices = NoticeStore()
        self.imds_monitors: list[Monitor] = [SpotInterruptionMonitor(imds), RebalanceMonitor(imds)]
        self.directives = DirectiveMonitor(self._own_node, self._bad_directive)
        self.imds_failures = 0
        self.signals: list[int] = []
        self.killed = False
        self.tracking: JobTracking | None = None
        self.doomed = False  # this instance got a spot notice: it will not join another gang
        self.hang = HangWatch(self.control, None, clock)
        self.hang_action: HealthAction | None = None
        self.unhealthy: str | None = None  # why the health policy stopped training on this node
        self.refused: str | None = None  # why the trainer refused to start (a "refused" event, agent.refusal)
        self.unavailable: str | None = None  # committed checkpoints it could not read now ("unavailable")
        self._metrics_at = 0  # bytes of metrics.jsonl already sent to MLflow
        self.log_sink = log_sink
        self.shipper: LogShipper | None = None
        self._registered_at = 0.0  # when NodeReady was last sent
        self._beat_at = 0.0  # a spare's last heartbeat

    def _bad_directive(self, why: str) -> None:
        self.reporter.anomaly("bad-directive", why)

    # --- registration -----------------------------------------------------------------------------
    def _own_node(self) -> NodeView | None:
        """This node's record (the directive read path); sends NodeReady again while the record
        still says PENDING some time after the last one (lost, or the job was not on this attempt yet)."""
        node = self.port.node(self.config.node)
        if node is not None and node.state == PENDING and self.clock() - self._registered_at >= REREGISTER_S:
            info("node record still PENDING; registering again")
            self.register()
        return node

    def register(self) -> None:
        """NodeReady (rank 0's carries its rendezvous port); the controller marks the node READY."""
        self._registered_at = self.clock()
        self.reporter.node_ready()

    def _stopping(self) -> bool:
        return any(sig in (signal.SIGTERM, signal.SIGINT) for sig in self.signals)

    def wait_for_rank0(self) -> tuple[str, int]:
        """Rank 0's address and rendezvous port (it may be a survivor of an earlier gang), once the
        controller recorded its NodeReady."""
        c = self.config
        if c.rank == 0:
            return c.private_ip or "127.0.0.1", c.master_port
        give_up = self.clock() + c.rank0_wait_s
        while self.clock() < give_up:
            if self._stopping():
                raise SpotrelayError("stopped by a signal while waiting for rank 0")
            found = rank0_address(self.port.nodes(), c.attempt)
            if found is not None:
                return found[0], found[1] or c.master_port
            self.sleep(1.0)
        raise AgentConfigError(f"rank 0 of {c.job_id} attempt {c.attempt} did not register in {c.rank0_wait_s}s")

    # --- detect ---------------------------------------------------------------------------------
    def _poll_imds(self) -> list[Notice]:
        found: list[Notice] = []
        try:
            for monitor in self.imds_monitors:
                found += monitor.poll()
        except (ImdsUnavailableError, ValueError) as exc:
            self.imds_failures += 1
            if self.imds_failures == self.config.imds_failures_anomaly:
                self.reporter.anomaly("imds-unreachable", str(exc))
            return found
        self.imds_failures = 0
        return found

    def _poll_directives(self) -> list[Notice]:
        try:
            return self.directives.poll()
        except Exception as exc:  # DynamoDB throttled or unreachable: IMDS still covers notices
            warn("directive poll failed", error=str(exc))
            return []

    def _took_directive(self, directive_id: str, kind: str) -> None:
        """Report the directive taken; the controller clears it (the notice store keeps it from
        being taken twice until then)."""
        self.reporter.directive_seen(directive_id, kind)

    # --- run ------------------------------------------------------------------------------------
    def run(self, job: JobView, spec: JobSpec, track: bool = False) -> int:
        c = self.config
        self.killed = False
        self.register()
        if track and c.rank == 0:
            try:  # the record as it is now: this attempt's pool, steps lost, cost so far
                job = self.port.job() or job
            except Exception as exc:
                warn("job record unreadable; tracking with the old one", error=str(exc))
        # MLflow's first open (store migrations) can take a while: before the launch only when the job's
        # run must be created for the trainer's environment, else after it (off a restart's path)
        early = track and c.rank == 0 and self.tracking is None and not job.mlflow_run_id
        if early:
            self.tracking = JobTracking.for_job(c, job, spec, self.reporter.tracking_started)
        env = contract_env(c, job, spec, self.tracking.run_id if self.tracking else job.mlflow_run_id)
        wait_for_drain(self.port.nodes, c.attempt, self.clock, self.sleep, self._stopping)
        # a later attempt's node mirrors the newest commit beside its start-up (no download at restore)
        prefetch = Prefetch(lambda: self._mirror(env, spec), self.control).start() if c.attempt > 1 else None
        master, port = self.wait_for_rank0()
        per_node = c.nproc_per_node or max(spec.resources.gpus_per_node, 1)  # CPU jobs: one rank per node
        rdzv = Rendezvous(c.nodes or spec.resources.nodes, c.rank, per_node, master, port)
        plan = self.plan_builder(spec, rdzv, env, c.instance_type, c.python or sys.executable)
        control.clear_request(self.control)
        events_file = self.control / control.EVENTS_FILE
        offset = events_file.stat().st_size if events_file.exists() else 0  # earlier runs' events are old news
        metrics_file = self.control / control.METRICS_FILE
        self._metrics_at = metrics_file.stat().st_size if metrics_file.exists() else 0
        c.work_dir.mkdir(parents=True, exist_ok=True)
        self.hang = HangWatch(self.control, spec.health.hang_after_s if spec.health.enabled else None, self.clock)
        self.hang_action, self.unhealthy = spec.health.action(AnomalyKind.HANG), None
        self.refused = self.unavailable = None
        log_path = c.work_dir / f"train-a{c.attempt}.log"
        self.shipper = LogShipper(self.log_sink, c.job_id, c.attempt, c.rank, log_path) if self.log_sink else None
        with open(log_path, "ab") as log:
            proc = TrainingProcess(plan, self.control, log)
            info("launching", argv=plan.argv, master=f"{master}:{port}")
            proc.start()
            if not early:
                self._track_attempt(track, job, spec)
            self.hang.reset()
            self.reporter.training_started()
            code, offset = self._loop(proc, offset)
        if prefetch is not None:
            prefetch.stop()
        self._follow(offset)
        if self.shipper:
            self.shipper.ship(final=True)
        exit_code, reason = classify_exit(
            code, proc.worker_codes(), self.responder.pending, self.responder.committed_since_request, self.killed
        )
        if self.unhealthy:
            exit_code, reason = ExitCode.UNHEALTHY, self.unhealthy
        tail = failure_tail(exit_code, self.control / EXIT_DIR, log_path)
        if self.refused is not None and exit_code != ExitCode.DONE:  # whatever code the script chose
            exit_code, reason, tail = ExitCode.REFUSED, f"refused: {self.refused}", bound(self.refused)
        elif self.unavailable is not None and exit_code != ExitCode.DONE:  # the infrastructure's: retried
            exit_code, reason = ExitCode.INFRA_ERROR, f"infra-error: {self.unavailable}"
            tail = bound(self.unavailable)
        last = self.responder.last_committed
        if self.tracking:  # first: the controller may terminate this instance once it hears the exit
            ckpt_dir = Path(env[control.ENV_CHECKPOINT_DIR])
            manifest = ckpt_dir / f"step-{last.step:08d}" / "manifest.json" if last else None
            if not self.tracking.end_within(self.config.track_end_s, exit_code, last.step if last else None,
                                            reason, manifest, last.uri if last else None,
                                            spec.tracking.register_model):
                warn("MLflow did not record the attempt's end in time; reporting the exit first",
                     bound_s=self.config.track_end_s)
        self.reporter.training_exited(
            exit_code,
            reason,
            control.read_progress(self.control),
            last.step if last else None,
            tail,
        )
        info("training exited", exit_code=exit_code, reason=reason)
        return exit_code

    def _track_attempt(self, track: bool, job: JobView, spec: JobSpec) -> None:
        c = self.config
        if track and c.rank == 0 and self.tracking is None:
            self.tracking = JobTracking.for_job(c, job, spec, self.reporter.tracking_started)
        elif self.tracking is not None:
            self.tracking.attempt_started(c, spec, job)

    def serve(self, job: JobView, spec: JobSpec, track: bool = False) -> int:
        """Run this attempt; a surviving node then waits (``linger_s``) to be carried into the next
        gang (the controller's replace-lost-nodes: a new node item for this instance, RESTART).
        ``track``: keep the job's MLflow run (node rank 0 only, when the spec has a tracking URI)."""
        if self.config.rank >= spec.resources.nodes and not self._stand_by(job, spec):
            return ExitCode.DONE  # a hot spare that was never needed
        while True:
            code = self.run(job, spec, track)
            if code in (ExitCode.DONE, ExitCode.CANCELLED) or self.doomed or not self._adopt_next_attempt():
                return code

    def _loop(self, proc: TrainingProcess, offset: int) -> tuple[int, int]:
        c = self.config
        next_imds = next_directive = 0.0
        next_beat = self.clock() + c.heartbeat_s
        while True:
            now = self.clock()
            found: list[Notice] = []
            if now >= next_imds:
                found += self._poll_imds()
                next_imds = now + c.imds_poll_s
            if now >= next_directive:
                found += self._poll_directives()
                next_directive = now + c.directive_poll_s
            for notice in found:
                self._handle(notice, proc)
            self._handle_signals(proc)
            offset = self._follow(offset)
            self.responder.check_deadline(now)
            code = proc.poll()
            if code is not None:
                return code, offset
            if not self.killed and self.responder.kill_due(now, c.stop_grace_s):
                warn("trainer did not stop in time; killing it")
                self.killed = True
                return proc.kill_tree(5.0), offset
            if now >= next_beat:
                self._heartbeat()
                next_beat = now + c.heartbeat_s
            if self.shipper:
                self.shipper.tick(now)
            stuck = self.hang.check(now)
            if stuck is not None and self._on_hang(stuck, proc):
                return proc.kill_tree(5.0), offset
            self.sleep(TICK_S)

    def _follow(self, offset: int) -> int:
        events, offset = control.read_events(self.control, offset)
        self.responder.on_events(events)
        if self.tracking:
            rows, self._metrics_at = control.read_metrics(self.control, self._metrics_at)
            self.tracking.add_metrics(rows)
        for event in events:
            if self.tracking and event.kind == "checkpoint_committed":
                self.tracking.checkpoint(event.step, event.duration_s, event.emergency, event.stall_s)
            if event.kind == "refused" and self.refused is None:
                self.refused = event.detail
                warn("the trainer refused to start", detail=event.detail)
            if event.kind == "unavailable" and self.unavailable is None:
                self.unavailable = event.detail
                warn("the trainer could not read its checkpoints", detail=event.detail)
            if event.kind == "resumed" and self.config.rank == 0:  # what was restored, not what launch guessed
                self.reporter.training_resumed(event.step)
                if self.tracking:
                    self.tracking.resumed(event.step)
            if event.kind == "anomaly" and event.anomaly is not None and self.config.rank == 0:
                # every node's trainer agreed on it; node rank 0 speaks for the gang
                self.reporter.anomaly(event.anomaly.kind.value, event.anomaly.detail, health=event.anomaly)
        return offset

    def _on_hang(self, step: int, proc: TrainingProcess) -> bool:
        """Dump the stacks, report, act by the policy; True ends the attempt (``stop``)."""
        c = self.config
        stacks = dump_stacks(self.control)
        path = c.work_dir / f"stacks-a{c.attempt}.txt"
        path.write_text(stacks)
        action = self.hang_action or HealthAction.ROLLBACK
        after = self.hang.after_s or 0.0
        finding = HealthAnomaly(kind=AnomalyKind.HANG, action=action, step=step, node_rank=c.rank,
                                detail=f"no step finished for {after:.0f} s after step {step}; stacks in {path}:\n"
                                       + stacks[:3000])  # fmt: skip
        warn("training hangs", step=step, action=action.value, stacks=str(path))
        self.reporter.anomaly(finding.kind.value, finding.detail, health=finding)
        if action is HealthAction.STOP:
            self.unhealthy = f"hang: no step finished for {after:.0f} s after step {step}"
            self.killed = True
            return True
        if action is HealthAction.ROLLBACK:  # restart from the latest checkpoint, like a RESTART directive
            proc.kill_tree(c.stop_grace_s)
            self.responder.reset()
            proc.start()
            self.hang.reset()
        return False

    def _handle(self, notice: Notice, proc: TrainingProcess) -> None:
        new = self.notices.add(notice, self.clock())
        if new is None:
            return
        decision = self.responder.apply(new)
        if new.kind is NoticeKind.SPOT_INTERRUPTION:
            self.doomed = True
            self.reporter.notice_seen(new.action, new.time)
        if decision.restart:
            info("restarting the training command")
            proc.kill_tree(self.config.stop_grace_s)
            self.responder.reset()
            proc.start()
        if new.kind is NoticeKind.DIRECTIVE and new.notice_id:
            self._took_directive(new.notice_id, new.action)

    def _heartbeat(self) -> None:
        self.reporter.heartbeat(control.read_progress(self.control))

    # --- signals --------------------------------------------------------------------------------
    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.signals.append(signum)

    def _handle_signals(self, proc: TrainingProcess) -> None:
        while self.signals:
            signum = self.signals.pop(0)
            stops = (signal.SIGTERM, signal.SIGINT)
            if signum in stops and self.responder.pending is None:
                # first stop signal (shutdown, systemctl stop): save and stop like a preemption
                self.responder.ask(
                    control.RequestKind.CHECKPOINT_AND_STOP,
                    self.clock() + self.config.stop_grace_s,
                    f"agent got signal {signum}",
                )
            else:
                proc.relay(signum)  # a second stop signal, or HUP/USR1/USR2: the launcher passes it on
