"""Reporting: agent events through the agent's port, structured JSON logs (MLflow: agent/tracking.py).

Events are the pydantic models of :mod:`spotrelay.contracts.events`; the port
(:mod:`spotrelay.contracts.agent`) publishes them (source ``spotrelay.agent``, ``detail-type`` = the
event's ``kind``) and the controller parses them with ``parse_agent_event``. They are the agent's only
writes: the controller's handlers update the node and job items. A failed publish is logged and
retried a little, never fatal: the agent's first duty is the checkpoint; the controller also learns
of a node that went silent from reconcile (stale heartbeats) and from EC2.
"""

from __future__ import annotations

import json
import logging
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

from agent.config import AgentConfig
from spotrelay.contracts.agent import AgentPort
from spotrelay.contracts.events import (
    AgentEventModel,
    Anomaly,
    CheckpointCommitted,
    DirectiveSeen,
    Heartbeat,
    NodeReady,
    NoticeSeen,
    TrackingStarted,
    TrainingExited,
    TrainingResumed,
    TrainingStarted,
)
from spotrelay.contracts.health import HealthAnomaly

log = logging.getLogger("spotrelay.agent")


class JsonFormatter(logging.Formatter):
    """One JSON object per line, with the job and node on every line."""

    def __init__(self, static: dict[str, Any]) -> None:
        super().__init__()
        self.static = static

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
            **self.static,
            **getattr(record, "fields", {}),
        }
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def log_as(node_id: str) -> None:
    """Later lines name the node item this agent serves now (a survivor joins a later attempt's)."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler.formatter, JsonFormatter):
            handler.formatter.static["node_id"] = node_id


def setup_logging(job_id: str, node_id: str, level: int = logging.INFO) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter({"job_id": job_id, "node_id": node_id}))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("botocore", "boto3", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def info(msg: str, **fields: Any) -> None:
    log.info(msg, extra={"fields": fields})


def warn(msg: str, **fields: Any) -> None:
    log.warning(msg, extra={"fields": fields})


class Reporter:
    """Builds agent events for this node and reports them through the port."""

    def __init__(
        self,
        config: AgentConfig,
        port: AgentPort,
        clock: Callable[[], float] = time.time,
        attempts: int = 3,
    ) -> None:
        self.config = config
        self.port = port
        self.clock = clock
        self.attempts = attempts
        self.published: list[AgentEventModel] = []

    def _common(self) -> dict[str, Any]:
        c = self.config
        return {
            "event_id": uuid.uuid4().hex,
            "job_id": c.job_id,
            "node_id": c.node,
            "instance_id": c.instance_id or "unknown",
            "attempt": c.attempt,
            "rank": c.rank,
            "time": self.clock(),
        }

    def publish(self, event: AgentEventModel) -> bool:
        detail = event.model_dump(mode="json")
        for attempt in range(self.attempts):
            try:
                self.port.report(event)
            except Exception as exc:  # the network or EventBridge; keep the agent going
                warn("publish failed", kind=event.kind, attempt=attempt + 1, error=str(exc))
                time.sleep(0.2 * (attempt + 1))
                continue
            self.published.append(event)
            info(f"published {event.kind}", event=detail)
            return True
        return False

    def node_ready(self) -> bool:
        """Register: node rank 0 also publishes the rendezvous port it serves."""
        c = self.config
        port = c.master_port if c.rank == 0 else None
        return self.publish(NodeReady(**self._common(), private_ip=c.private_ip or "", region=c.region or "",
                                      az=c.az or "", master_port=port))

    def heartbeat(self, step: int | None) -> bool:
        return self.publish(Heartbeat(**self._common(), step=step))

    def training_started(self) -> bool:
        return self.publish(TrainingStarted(**self._common()))

    def notice_seen(self, action: str, action_time: float | None) -> bool:
        return self.publish(NoticeSeen(**self._common(), action=action or "terminate", action_time=action_time))

    def directive_seen(self, directive_id: str, kind: str) -> bool:
        return self.publish(DirectiveSeen(**self._common(), directive_id=directive_id, directive_kind=kind))

    def tracking_started(self, mlflow_run_id: str) -> bool:
        return self.publish(TrackingStarted(**self._common(), mlflow_run_id=mlflow_run_id))

    def checkpoint_committed(
        self,
        step: int,
        uri: str,
        duration_s: float,
        emergency: bool,
        deadline: float | None,
        met_deadline: bool | None,
        total_bytes: int | None = None,
    ) -> bool:
        return self.publish(
            CheckpointCommitted(
                **self._common(),
                step=step,
                uri=uri,
                duration_s=max(duration_s, 0.0),
                emergency=emergency,
                deadline=deadline,
                met_deadline=met_deadline,
                total_bytes=total_bytes,
            )
        )

    def training_exited(
        self,
        exit_code: int,
        reason: str,
        last_step: int | None,
        last_committed_step: int | None,
        output_tail: str = "",
    ) -> bool:
        return self.publish(
            TrainingExited(
                **self._common(),
                exit_code=exit_code,
                reason=reason,
                last_step=last_step,
                last_committed_step=last_committed_step,
                output_tail=output_tail,
            )
        )

    def training_resumed(self, step: int) -> bool:
        return self.publish(TrainingResumed(**self._common(), step=step))

    def anomaly(self, what: str, detail: str = "", health: HealthAnomaly | None = None) -> bool:
        return self.publish(Anomaly(**self._common(), what=what, detail=detail, health=health))
