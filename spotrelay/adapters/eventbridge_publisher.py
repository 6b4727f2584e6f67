"""EventPublisher on EventBridge: PutEvents on the configured bus (the agent's events, and
controller events for observers). A partial failure (FailedEntryCount) is an error, not a log line."""

from __future__ import annotations

import json
from typing import Any

from botocore.exceptions import ClientError

from spotrelay.adapters.aws import client, error_code
from spotrelay.errors import NotFoundError, PermanentError, RetryableError
from spotrelay.settings import settings


class EventBridgePublisher:
    def __init__(self, bus_name: str | None = None, region: str | None = None) -> None:
        self._bus = bus_name
        self._region = region

    def publish(self, source: str, detail_type: str, detail: dict[str, Any]) -> None:
        entry = {"Source": source, "DetailType": detail_type, "Detail": json.dumps(detail, default=str),
                 "EventBusName": self._bus or settings().event_bus}
        try:
            response = client("events", self._region).put_events(Entries=[entry])
        except ClientError as exc:
            if error_code(exc) == "ResourceNotFoundException":
                raise NotFoundError(f"event bus {entry['EventBusName']} does not exist") from exc
            if error_code(exc) in ("ThrottlingException", "InternalException"):
                raise RetryableError(f"PutEvents throttled ({error_code(exc)})") from exc
            raise
        if response.get("FailedEntryCount", 0):
            failed = response["Entries"][0]
            code = failed.get("ErrorCode", "")
            message = f"PutEvents rejected {detail_type}: {code} {failed.get('ErrorMessage', '')}"
            if code in ("ThrottlingException", "InternalFailure"):
                raise RetryableError(message)
            raise PermanentError(message)
