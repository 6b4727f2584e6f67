"""The training output of a job's nodes: one stream per (attempt, node rank)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

LOG_GROUP_ENV = "SPOTRELAY_LOG_GROUP"
LOG_GROUP_DEFAULT = "/spotrelay/training"  # created by the home stack (cdk/home_stack.py)


@dataclass(frozen=True)
class LogStream:
    attempt: int
    rank: int
    name: str  # the adapter's id: a file path, or a CloudWatch log stream name


def stream_name(job_id: str, attempt: int, rank: int) -> str:
    """The CloudWatch log stream of one node's training output."""
    return f"{job_id}/a{attempt}-r{rank}"


class TrainingLogs(Protocol):
    def streams(self, job_id: str) -> list[LogStream]:
        """Every stream of the job, by attempt then rank."""
        ...

    def read(self, stream: LogStream, cursor: str | None = None) -> tuple[list[str], str | None]:
        """Lines after ``cursor`` (None: from the start) and the cursor to continue from."""
        ...
