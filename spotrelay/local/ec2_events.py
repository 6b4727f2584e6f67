"""EC2 events the twin's compute puts on its bus, in the shape EC2 sends them (tests/events/)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

from spotrelay.ports.compute import Instance

log = logging.getLogger(__name__)

ACCOUNT = "123456789012"
Listener = Callable[[str, dict[str, Any]], None]


class Ec2EventBus:
    """Publishes ``aws.ec2`` events on the twin's EventBridge bus (moto), which routes them by rule."""

    def __init__(self, bus_name: str | None = None) -> None:
        self.bus_name = bus_name
        self.listeners: list[Listener] = []  # the demo's live view and timeline listen here
        self.sent: list[tuple[float, str, dict[str, Any]]] = []

    def spot_interruption_warning(self, inst: Instance) -> None:
        self._put(
            inst,
            "EC2 Spot Instance Interruption Warning",
            {"instance-id": inst.instance_id, "instance-action": "terminate"},
        )

    def rebalance_recommendation(self, inst: Instance) -> None:
        self._put(inst, "EC2 Instance Rebalance Recommendation", {"instance-id": inst.instance_id})

    def state_change(self, inst: Instance, state: str) -> None:
        self._put(inst, "EC2 Instance State-change Notification", {"instance-id": inst.instance_id, "state": state})

    def _put(self, inst: Instance, detail_type: str, detail: dict[str, Any]) -> None:
        from spotrelay.adapters.aws import client
        from spotrelay.settings import settings

        self.sent.append((time.time(), detail_type, detail))
        for listener in self.listeners:
            listener(detail_type, detail)
        region = inst.pool.region
        entry = {
            "Source": "aws.ec2",
            "DetailType": detail_type,
            "Detail": json.dumps(detail),
            "Resources": [f"arn:aws:ec2:{region}:{ACCOUNT}:instance/{inst.instance_id}"],
            "EventBusName": self.bus_name or settings().event_bus,
        }
        try:
            client("events").put_events(Entries=[entry])
        except Exception:  # the bus is gone when the twin shuts down; EC2 events are best effort too
            log.warning("could not put %s for %s", detail_type, inst.instance_id, exc_info=True)
