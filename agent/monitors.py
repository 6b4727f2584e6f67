"""Monitors only detect: each ``poll()`` returns the notices visible right now, as :class:`Notice`.

They do not deduplicate (the notice store does) and do not act (actions do). IMDS answers the
same interruption on every poll until the instance is gone; the controller's directive stays on
the node item until the controller clears it (after the agent's ``DirectiveSeen``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, ValidationError

from agent.imds import ImdsClient
from spotrelay.contracts.agent import NodeView
from spotrelay.contracts.events import Directive
from spotrelay.errors import validation_message


class NoticeKind(StrEnum):
    SPOT_INTERRUPTION = "spot-interruption"  # IMDS spot/instance-action
    REBALANCE = "rebalance"  # IMDS events/recommendations/rebalance
    DIRECTIVE = "directive"  # the controller, through the node's DynamoDB item


@dataclass(frozen=True)
class Notice:
    kind: NoticeKind
    source: str  # "imds" | "directive"
    notice_id: str | None = None  # directive_id; IMDS notices have none (the store hashes them)
    action: str = ""  # terminate/stop/hibernate, or the DirectiveKind
    time: float | None = None  # when the action happens (interruption) or was noticed (rebalance)
    deadline: float | None = None  # directives carry their own
    reason: str = ""
    raw: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


class Monitor(Protocol):
    name: str

    def poll(self) -> list[Notice]: ...


def parse_time(text: str) -> float:
    """IMDS times look like ``2026-11-30T08:22:00Z``."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


class _InstanceAction(BaseModel):
    model_config = ConfigDict(extra="ignore")
    action: str
    time: str


class _Rebalance(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    noticeTime: str  # the IMDS field name


class SpotInterruptionMonitor:
    name = "spot-itn"

    def __init__(self, imds: ImdsClient) -> None:
        self.imds = imds

    def poll(self) -> list[Notice]:
        data = self.imds.get_json("meta-data/spot/instance-action")
        if data is None:
            return []
        action = _InstanceAction.model_validate(data)
        return [
            Notice(
                NoticeKind.SPOT_INTERRUPTION,
                "imds",
                action=action.action,
                time=parse_time(action.time),
                reason=f"spot interruption: {action.action} at {action.time}",
                raw=dict(data),
            )
        ]


class RebalanceMonitor:
    name = "rebalance"

    def __init__(self, imds: ImdsClient) -> None:
        self.imds = imds

    def poll(self) -> list[Notice]:
        data = self.imds.get_json("meta-data/events/recommendations/rebalance")
        if data is None:
            return []
        notice = _Rebalance.model_validate(data)
        return [
            Notice(
                NoticeKind.REBALANCE,
                "imds",
                action="rebalance",
                time=parse_time(notice.noticeTime),
                reason=f"rebalance recommendation at {notice.noticeTime}",
                raw=dict(data),
            )
        ]


class DirectiveMonitor:
    """Reads the ``directive`` of this node's record through the agent's port (see docs/agent.md)."""

    name = "directive"

    def __init__(self, read_node: Callable[[], NodeView | None],
                 on_invalid: Callable[[str], None] | None = None) -> None:
        self.read_node = read_node
        self.on_invalid = on_invalid

    def poll(self) -> list[Notice]:
        node = self.read_node()
        raw = node.directive if node is not None else None
        if not raw:
            return []
        try:
            directive = Directive.model_validate(raw)
        except ValidationError as exc:
            if self.on_invalid:
                self.on_invalid(f"unreadable directive {raw!r}: {validation_message(exc.errors()[0])}")
            return []
        return [
            Notice(
                NoticeKind.DIRECTIVE,
                "directive",
                notice_id=directive.directive_id,
                action=directive.kind.value,
                time=directive.issued_at,
                deadline=directive.deadline,
                reason=directive.reason or f"directive {directive.kind.value}",
                raw=dict(raw),
            )
        ]
