"""What a node does between gangs: a hot spare standing by, and a surviving node joining a later
attempt (possibly at another gang size). Mixed into agent.daemon.Agent, whose state it uses."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from agent.actions import Responder
from agent.config import AgentConfig
from agent.launcher import contract_env
from agent.monitors import Notice, NoticeKind
from agent.notice_store import NoticeStore
from agent.reporting import Reporter, info, log_as
from agent.spare import SpareCache, StandBy
from spotrelay.contracts import control
from spotrelay.contracts.agent import AgentPort, JobView, NodeView, next_assignment
from spotrelay.contracts.events import Directive, DirectiveKind, parse_directive
from spotrelay.errors import validation_message
from spotrelay.spec.models import JobSpec


class Succession:
    """The Agent's state this part reads and sets (agent.daemon.Agent defines and owns it)."""

    config: AgentConfig
    port: AgentPort
    reporter: Reporter
    clock: Callable[[], float]
    sleep: Callable[[float], None]
    signals: list[int]
    notices: NoticeStore
    control: Path
    responder: Responder
    doomed: bool
    _beat_at: float
    register: Callable[[], None]
    _poll_imds: Callable[[], list[Notice]]
    _took_directive: Callable[[str, str], None]
    _bad_directive: Callable[[str], None]

    def _stand_by(self, job: JobView, spec: JobSpec) -> bool:
        """A hot spare: registered, out of training, mirroring the newest checkpoint, until recover
        promotes it (True) or the job ends or its instance is doomed (False)."""
        self.register()
        env = contract_env(self.config, job, spec, job.mlflow_run_id)
        bench = StandBy(self._mirror(env, spec), self._spare_alive)
        info("hot spare standing by", rank=self.config.rank)
        return self._adopt_next_attempt(linger_s=float("inf"), while_waiting=bench.tick)

    def _mirror(self, env: dict[str, str], spec: JobSpec) -> SpareCache:
        return SpareCache(Path(env[control.ENV_CHECKPOINT_DIR]), env.get(control.ENV_CHECKPOINT_URI),
                          spec.checkpoint.keep_local)

    def _spare_alive(self) -> bool:
        if any(n.kind is NoticeKind.SPOT_INTERRUPTION for n in self._poll_imds()):
            self.doomed = True
            return False
        job = self.port.job()
        if job is None or job.terminal:
            return False
        if self.clock() - self._beat_at >= self.config.heartbeat_s:
            self._beat_at = self.clock()
            self.reporter.heartbeat(None)
        return True

    def _adopt_next_attempt(self, linger_s: float | None = None,
                            while_waiting: Callable[[], bool] | None = None) -> bool:
        c = self.config
        give_up = self.clock() + (c.linger_s if linger_s is None else linger_s)
        info("waiting to join a later attempt", linger_s=linger_s or c.linger_s)
        while self.clock() < give_up and not self.signals:
            node = next_assignment(self.port.nodes(), c.instance_id, c.attempt)
            if node is not None:
                restart = self._restart_directive(node)
                self.config = joined_config(c, node, restart)
                self.reporter.config = self.config
                log_as(self.config.node)
                self.responder = Responder(self.control, self.reporter, self.clock)
                if restart is not None:  # this adoption is the restart
                    self.notices.add(
                        Notice(NoticeKind.DIRECTIVE, "directive", restart.directive_id, restart.kind.value),
                        self.clock(),
                    )
                    self._took_directive(restart.directive_id, restart.kind.value)
                info("joining attempt", attempt=node.attempt, node_id=node.node_id, rank=node.rank,
                     nodes=self.config.nodes)
                return True
            if while_waiting is not None and not while_waiting():
                return False
            self.sleep(c.directive_poll_s)
        return False

    def _restart_directive(self, node: NodeView) -> Directive | None:
        """The RESTART that carries this survivor into ``node``'s attempt (a model, parsed)."""
        if not node.directive:
            return None
        try:
            directive = parse_directive(node.directive)
        except ValidationError as exc:
            self._bad_directive(f"unreadable directive {node.directive!r}: {validation_message(exc.errors()[0])}")
            return None
        return directive if directive.kind is DirectiveKind.RESTART else None


def joined_config(config: AgentConfig, node: NodeView, restart: Directive | None) -> AgentConfig:
    """This agent's config in the later attempt ``node`` belongs to: its attempt, rank and node id,
    and the gang's size in nodes when the RESTART names one (``world_size``: node ranks
    0..world_size-1 train; an elastic resize). The launcher then restarts with that ``--nnodes`` and
    the training session resumes resharded from the newest checkpoint, keeping the global batch."""
    update: dict[str, Any] = {"attempt": node.attempt, "rank": node.rank, "node_id": node.node_id}
    if restart is not None and restart.world_size is not None:
        update["nodes"] = restart.world_size
    return config.model_copy(update=update)
