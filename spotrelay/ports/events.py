"""Publishing events on the bus (agent events; controller events for observers)."""

from __future__ import annotations

from typing import Any, Protocol


class EventPublisher(Protocol):
    def publish(self, source: str, detail_type: str, detail: dict[str, Any]) -> None: ...
