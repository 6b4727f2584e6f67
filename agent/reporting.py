"""Reporting: agent events on EventBridge, structured JSON logs, MLflow.

Events use source ``spotrelay.agent``, ``detail-type`` = the event's ``kind`` and the pydantic model
from :mod:`spotrelay.contracts.events` as ``detail``, so the controller parses them with
``parse_agent_event``. A failed publish is logged and retried a little, never fatal: the agent's
first duty is the checkpoint, and the controller also learns the outcome from the node item.
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
from spotrelay.contracts.events import (
    AGENT_SOURCE,
    Anomaly,
    CheckpointCommitted,
    Heartbeat,
    NodeReady,
    TrainingExited,
)
from spotrelay.contracts.health import HealthAnomaly
from spotrelay.domain.models import Job
from spotrelay.ports.events import EventPublisher
from spotrelay.ports.job_store import JobStore
from spotrelay.spec.models import JobSpec

log = logging.getLogger("spotrelay.agent")

AgentModel = NodeReady | Heartbeat | CheckpointCommitted | TrainingExited | Anomaly


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
    """Builds agent events for this node and publishes them."""

    def __init__(
        self,
        config: AgentConfig,
        publisher: EventPublisher,
        clock: Callable[[], float] = time.time,
        attempts: int = 3,
    ) -> None:
        self.config = config
        self.publisher = publisher
        self.clock = clock
        self.attempts = attempts
        self.published: list[AgentModel] = []

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

    def publish(self, event: AgentModel) -> bool:
        detail = event.model_dump(mode="json")
        for attempt in range(self.attempts):
            try:
                self.publisher.publish(AGENT_SOURCE, event.kind, detail)
            except Exception as exc:  # the network or EventBridge; keep the agent going
                warn("publish failed", kind=event.kind, attempt=attempt + 1, error=str(exc))
                time.sleep(0.2 * (attempt + 1))
                continue
            self.published.append(event)
            info(f"published {event.kind}", event=detail)
            return True
        return False

    def node_ready(self) -> bool:
        c = self.config
        return self.publish(
            NodeReady(**self._common(), private_ip=c.private_ip or "", region=c.region or "", az=c.az or "")
        )

    def heartbeat(self, step: int | None) -> bool:
        return self.publish(Heartbeat(**self._common(), step=step))

    def checkpoint_committed(
        self,
        step: int,
        uri: str,
        duration_s: float,
        emergency: bool,
        deadline: float | None,
        met_deadline: bool | None,
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
            )
        )

    def training_exited(
        self, exit_code: int, reason: str, last_step: int | None, last_committed_step: int | None
    ) -> bool:
        return self.publish(
            TrainingExited(
                **self._common(),
                exit_code=exit_code,
                reason=reason,
                last_step=last_step,
                last_committed_step=last_committed_step,
            )
        )

    def anomaly(self, what: str, detail: str = "", health: HealthAnomaly | None = None) -> bool:
        return self.publish(Anomaly(**self._common(), what=what, detail=detail, health=health))


class JobTracking:
    """One MLflow run per job, resumed across attempts; only node rank 0 writes to it.

    The run id lives on the job record (``mlflow_run_id``); a run tagged ``spotrelay.job_id`` is
    found again if that write was lost. Params are logged once; per-attempt values are metrics with
    the attempt number as their step, since MLflow refuses to change a logged param.
    """

    def __init__(self, client: Any, run_id: str, attempt: int) -> None:
        self.client = client
        self.run_id = run_id
        self.attempt = attempt

    @classmethod
    def for_job(cls, config: AgentConfig, job: Job, spec: JobSpec, store: JobStore) -> JobTracking | None:
        uri = spec.tracking.tracking_uri
        if not uri:
            return None
        try:
            from mlflow.tracking import MlflowClient

            client = MlflowClient(tracking_uri=uri)
            run_id = job.mlflow_run_id or cls._find_or_create(client, config, spec)
            if job.mlflow_run_id != run_id:
                store.update_job(
                    job.job_id,
                    lambda j: None if j.mlflow_run_id == run_id else j.model_copy(update={"mlflow_run_id": run_id}),
                )
            tracking = cls(client, run_id, config.attempt)
            tracking.attempt_started(config, spec)
            return tracking
        except Exception as exc:  # tracking must never stop training
            warn("MLflow unavailable; not tracking", error=str(exc))
            return None

    @staticmethod
    def _find_or_create(client: Any, config: AgentConfig, spec: JobSpec) -> str:
        name = spec.tracking.mlflow_experiment or "spotrelay"
        experiment = client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment else client.create_experiment(name)
        found = client.search_runs(
            [experiment_id], filter_string=f"tags.`spotrelay.job_id` = '{config.job_id}'", max_results=1
        )
        if found:
            return str(found[0].info.run_id)
        tags = {**spec.tracking.tags, "spotrelay.job_id": config.job_id, "mlflow.runName": spec.name}
        return str(client.create_run(experiment_id, tags=tags).info.run_id)

    def attempt_started(self, config: AgentConfig, spec: JobSpec) -> None:
        logged = self.client.get_run(self.run_id).data.params
        params = {
            "job_id": config.job_id,
            "nodes": spec.resources.nodes,
            "launcher": spec.launcher.type,
            "gpus_per_node": spec.resources.gpus_per_node,
            "checkpoint_every_steps": spec.checkpoint.every_steps,
        }
        for key, value in params.items():
            if key not in logged:
                self.client.log_param(self.run_id, key, value)
        self.client.set_tag(self.run_id, "spotrelay.attempt", str(config.attempt))
        self.client.set_tag(self.run_id, "spotrelay.instance_type", config.instance_type or "")
        self.client.log_metric(self.run_id, "attempt", config.attempt, step=config.attempt)

    def checkpoint(self, step: int, duration_s: float, emergency: bool) -> None:
        self._safe(self.client.log_metric, self.run_id, "checkpoint_duration_s", duration_s, step=step)
        if emergency:
            self._safe(self.client.log_metric, self.run_id, "emergency_checkpoint_step", step, step=self.attempt)

    def attempt_ended(self, exit_code: int, last_committed_step: int | None) -> None:
        self._safe(self.client.log_metric, self.run_id, "exit_code", exit_code, step=self.attempt)
        if last_committed_step is not None:
            self._safe(
                self.client.log_metric, self.run_id, "last_committed_step", last_committed_step, step=self.attempt
            )
        if exit_code == 0:
            self._safe(self.client.set_terminated, self.run_id, "FINISHED")

    @staticmethod
    def _safe(call: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        try:
            call(*args, **kwargs)
        except Exception as exc:
            warn("MLflow call failed", call=getattr(call, "__name__", "?"), error=str(exc))
