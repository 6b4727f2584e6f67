"""The per-job workflow (Step Functions standard execution in AWS and in the twin)."""

from __future__ import annotations

from typing import Any, Protocol


class Workflow(Protocol):
    def start(self, job_id: str, payload: dict[str, Any], name: str | None = None) -> str:
        """Start the job-run execution named after ``job_id`` (or ``name``: a handed-over one,
        services/handover.py); return its ARN.

        Starting twice with the same name and input returns the existing execution (idempotent).
        """

    def stop(self, execution_arn: str, cause: str) -> None: ...

    def send_success(self, task_token: str, output: dict[str, Any]) -> None: ...

    def send_failure(self, task_token: str, error: str, cause: str) -> None: ...

    def send_heartbeat(self, task_token: str) -> None: ...

    def describe(self, execution_arn: str) -> dict[str, Any]: ...
