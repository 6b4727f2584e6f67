"""Training logs in CloudWatch Logs: one group for the deployment, one stream per node and attempt.

The agent on each node writes its training output here (:meth:`put`); ``spotrelay logs`` reads it
(:meth:`streams`, :meth:`read`). The group is created by the stacks (cdk/agent_fleet.py).
"""

from __future__ import annotations

import re
from typing import Any

from spotrelay.adapters.aws import client, error_code
from spotrelay.errors import NotFoundError
from spotrelay.ports.logs import LogStream, stream_name

_STREAM = re.compile(r"/a(?P<attempt>\d+)-r(?P<rank>\d+)$")
MAX_BATCH_BYTES = 900_000  # PutLogEvents takes 1 MiB, counting 26 bytes per event


class CloudWatchTrainingLogs:
    def __init__(self, group: str, region: str | None = None) -> None:
        self.group, self.region = group, region
        self._streams: set[str] = set()

    def _logs(self) -> Any:
        return client("logs", self.region)

    def streams(self, job_id: str) -> list[LogStream]:
        found: list[LogStream] = []
        kwargs: dict[str, Any] = {"logGroupName": self.group, "logStreamNamePrefix": f"{job_id}/"}
        try:
            while True:
                page = self._logs().describe_log_streams(**kwargs)
                for s in page.get("logStreams", []):
                    match = _STREAM.search(s["logStreamName"])
                    if match:
                        found.append(LogStream(int(match["attempt"]), int(match["rank"]), s["logStreamName"]))
                if not page.get("nextToken"):
                    break
                kwargs["nextToken"] = page["nextToken"]
        except Exception as exc:
            if error_code(exc) == "ResourceNotFoundException":
                raise NotFoundError(f"log group {self.group} does not exist") from exc
            raise
        return sorted(found, key=lambda s: (s.attempt, s.rank))

    def read(self, stream: LogStream, cursor: str | None = None) -> tuple[list[str], str | None]:
        kwargs: dict[str, Any] = {"logGroupName": self.group, "logStreamName": stream.name, "startFromHead": True}
        if cursor:
            kwargs["nextToken"] = cursor
        lines: list[str] = []
        while True:
            page = self._logs().get_log_events(**kwargs)
            lines += [e["message"] for e in page.get("events", [])]
            token = page.get("nextForwardToken")
            if not page.get("events") or token == kwargs.get("nextToken"):
                return lines, token
            kwargs["nextToken"] = token

    def put(self, job_id: str, attempt: int, rank: int, lines: list[tuple[int, str]]) -> None:
        """Append ``(epoch ms, text)`` lines to the node's stream, creating it on first use."""
        name = stream_name(job_id, attempt, rank)
        if name not in self._streams:
            try:
                self._logs().create_log_stream(logGroupName=self.group, logStreamName=name)
            except Exception as exc:
                if error_code(exc) != "ResourceAlreadyExistsException":
                    raise
            self._streams.add(name)
        batch: list[dict[str, Any]] = []
        size = 0
        for ms, text in lines:
            message = text[:200_000] or " "  # an empty message is refused
            cost = len(message.encode()) + 26
            event = {"timestamp": ms, "message": message}
            if batch and (size + cost > MAX_BATCH_BYTES or len(batch) >= 10_000):
                self._logs().put_log_events(logGroupName=self.group, logStreamName=name, logEvents=batch)
                batch, size = [], 0
            batch.append(event)
            size += cost
        if batch:
            self._logs().put_log_events(logGroupName=self.group, logStreamName=name, logEvents=batch)
