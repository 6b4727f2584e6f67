"""Telling people (SNS topic; Slack subscribes to it)."""

from __future__ import annotations

from typing import Any, Protocol


class Notifier(Protocol):
    def notify(self, kind: str, job_id: str, subject: str, context: dict[str, Any],
               topic_arn: str | None = None) -> None: ...
