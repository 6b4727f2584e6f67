"""An in-process agent port for tests: the agent's events go straight into the controller's real
handler (``services.node_events.handle_agent_event``) over an in-memory job store, and its reads
project that store's records onto the port's views, as the AWS adapter does. So a test of the
agent runs the one-writer path end to end without AWS, and the node records it checks were
written by the controller."""

from __future__ import annotations

import threading
import time
from typing import Any

from spotrelay.adapters.memory_job_store import MemoryJobStore
from spotrelay.contracts.agent import JobView, NodeView
from spotrelay.contracts.events import AgentEventModel
from spotrelay.domain.models import Job
from spotrelay.errors import NotFoundError
from spotrelay.services.controller import Controller
from spotrelay.services.node_events import handle_agent_event

DURABLE_ROOT = "s3://test-bucket/checkpoints/"


class InProcessAgentPort:
    def __init__(self, job: Job, store: MemoryJobStore | None = None, apply: bool = True) -> None:
        self.store = store or MemoryJobStore()
        if self.store.find_job(job.job_id) is None:
            self.store.create_job(job)
        self.job_id = job.job_id
        self.ctl = Controller(store=self.store)
        self.apply = apply  # False: record only (a controller that never answers)
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.results: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    # --- the port ---------------------------------------------------------------------------------
    def report(self, event: AgentEventModel) -> None:
        with self.lock:
            self.sent.append((event.kind, event.model_dump(mode="json")))
            if self.apply:
                self.results.append(handle_agent_event(self.ctl, event, time.time()))

    def node(self, node_id: str) -> NodeView | None:
        try:
            return NodeView.model_validate(self.store.get_node(self.job_id, node_id).model_dump(mode="json"))
        except NotFoundError:
            return None

    def nodes(self) -> list[NodeView]:
        return [NodeView.model_validate(n.model_dump(mode="json")) for n in self.store.nodes_of(self.job_id)]

    def job(self) -> JobView | None:
        job = self.store.find_job(self.job_id)
        return JobView.model_validate(job.model_dump(mode="json")) if job else None

    def durable_root(self) -> str:
        return DURABLE_ROOT

    # --- for assertions ---------------------------------------------------------------------------
    def kinds(self) -> list[str]:
        return [k for k, _ in self.sent]

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [d for k, d in self.sent if k == kind]
