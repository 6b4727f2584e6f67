"""The job store: jobs and nodes with conditional writes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

from spotrelay.domain.models import Job, Node
from spotrelay.domain.status import JobStatus
from spotrelay.errors import ConflictError

R = TypeVar("R", Job, Node)


class JobStore(Protocol):
    def create_job(self, job: Job) -> None:
        """Insert a new job; ``AlreadyExistsError`` if the id is taken."""

    def get_job(self, job_id: str) -> Job:
        """``NotFoundError`` if absent."""

    def find_job(self, job_id: str) -> Job | None: ...

    def save_job(self, job: Job, expected_status: JobStatus, expected_version: int) -> Job:
        """Write ``job`` only if the stored one still has (status, version); bump the version.

        Raises ``ConflictError`` when the condition fails; nothing is changed then.
        """

    def update_job(self, job_id: str, change: Callable[[Job], Job | None], attempts: int = 3) -> Job | None:
        """Read, apply ``change`` (pure; may return None to skip), conditional-write; retry lost races."""

    def jobs_by_status(self, status: JobStatus) -> list[Job]: ...

    def all_jobs(self) -> list[Job]:
        """Every job, oldest submission first: a scan of the whole table (the CLI's unfiltered listing)."""

    def put_node(self, node: Node, expected_version: int | None = None) -> Node:
        """Create (``expected_version`` None, must not exist) or conditionally replace a node."""

    def get_node(self, job_id: str, node_id: str) -> Node: ...

    def nodes_of(self, job_id: str) -> list[Node]: ...

    def node_by_instance(self, instance_id: str) -> Node | None: ...

    def delete_node(self, node: Node) -> bool:
        """Delete ``node``'s record if it is still at ``node.version``; False when it changed or is gone."""

    def update_node(
        self, job_id: str, node_id: str, change: Callable[[Node], Node | None], attempts: int = 3
    ) -> Node | None: ...


def read_change_write(
    read: Callable[[], R], change: Callable[[R], R | None], write: Callable[[R, R], R], attempts: int
) -> R | None:
    """``update_job``/``update_node`` for every adapter: read, apply the pure ``change`` (None:
    nothing to do), write conditionally on what was read; re-read on a lost race."""
    for attempt in range(attempts):
        current = read()
        updated = change(current)
        if updated is None:
            return None
        try:
            return write(updated, current)
        except ConflictError:
            if attempt == attempts - 1:
                raise
    return None
