"""JobStore in memory, for the property tests and the simulator: the same conditional-write
semantics as the DynamoDB adapter (one contract test runs against both,
tests/integration/test_job_store.py).

Records are kept as JSON, as DynamoDB keeps ``doc``: a caller never holds a reference into the
store, so a change function that mutates what it read cannot write behind the condition.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from spotrelay.domain.models import Job, Node
from spotrelay.domain.status import JobStatus
from spotrelay.errors import AlreadyExistsError, ConflictError, NotFoundError
from spotrelay.ports.job_store import read_change_write


class MemoryJobStore:
    def __init__(self) -> None:
        self._jobs: dict[str, str] = {}
        self._nodes: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()  # one conditional check-and-write at a time, like an item write

    # --- jobs ----------------------------------------------------------------------------------
    def create_job(self, job: Job) -> None:
        with self._lock:
            if job.job_id in self._jobs:
                raise AlreadyExistsError(f"job {job.job_id} already exists")
            self._jobs[job.job_id] = job.model_dump_json()

    def find_job(self, job_id: str) -> Job | None:
        doc = self._jobs.get(job_id)
        return Job.model_validate_json(doc) if doc is not None else None

    def get_job(self, job_id: str) -> Job:
        job = self.find_job(job_id)
        if job is None:
            raise NotFoundError(f"job {job_id} not found")
        return job

    def save_job(self, job: Job, expected_status: JobStatus, expected_version: int) -> Job:
        new = job.model_copy(update={"version": expected_version + 1})
        with self._lock:
            doc = self._jobs.get(job.job_id)
            current = Job.model_validate_json(doc) if doc is not None else None
            if current is None or current.status is not expected_status or current.version != expected_version:
                raise ConflictError(
                    f"job {job.job_id} changed since read (expected {expected_status} v{expected_version})"
                )
            self._jobs[job.job_id] = new.model_dump_json()
        return new

    def update_job(self, job_id: str, change: Callable[[Job], Job | None], attempts: int = 3) -> Job | None:
        return read_change_write(
            lambda: self.get_job(job_id), change, lambda new, old: self.save_job(new, old.status, old.version),
            attempts,
        )

    def jobs_by_status(self, status: JobStatus) -> list[Job]:
        return [j for j in self.all_jobs() if j.status is status]

    def all_jobs(self) -> list[Job]:
        jobs = [Job.model_validate_json(doc) for doc in list(self._jobs.values())]
        return sorted(jobs, key=lambda j: j.created_at)

    # --- nodes ---------------------------------------------------------------------------------
    def put_node(self, node: Node, expected_version: int | None = None) -> Node:
        key = (node.job_id, node.node_id)
        with self._lock:
            doc = self._nodes.get(key)
            if expected_version is None:
                if doc is not None:
                    raise AlreadyExistsError(f"node {node.job_id}/{node.node_id} already exists")
                new = node.model_copy(update={"version": 1})
            else:
                if doc is None or Node.model_validate_json(doc).version != expected_version:
                    raise ConflictError(f"node {node.job_id}/{node.node_id} changed since read")
                new = node.model_copy(update={"version": expected_version + 1})
            self._nodes[key] = new.model_dump_json()
        return new

    def get_node(self, job_id: str, node_id: str) -> Node:
        doc = self._nodes.get((job_id, node_id))
        if doc is None:
            raise NotFoundError(f"node {job_id}/{node_id} not found")
        return Node.model_validate_json(doc)

    def nodes_of(self, job_id: str) -> list[Node]:
        keys = sorted(k for k in list(self._nodes) if k[0] == job_id)  # DynamoDB returns sort-key order
        return [Node.model_validate_json(self._nodes[k]) for k in keys]

    def delete_node(self, node: Node) -> bool:
        key = (node.job_id, node.node_id)
        with self._lock:
            doc = self._nodes.get(key)
            if doc is None or Node.model_validate_json(doc).version != node.version:
                return False
            del self._nodes[key]
            return True

    def node_by_instance(self, instance_id: str) -> Node | None:
        for doc in list(self._nodes.values()):
            node = Node.model_validate_json(doc)
            if node.instance_id == instance_id:
                return node
        return None

    def update_node(
        self, job_id: str, node_id: str, change: Callable[[Node], Node | None], attempts: int = 3
    ) -> Node | None:
        return read_change_write(
            lambda: self.get_node(job_id, node_id), change,
            lambda new, old: self.put_node(new, expected_version=old.version), attempts,
        )
