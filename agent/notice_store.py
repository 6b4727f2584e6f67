"""Deduplicates notices and works out their deadline.

Every poll sees the same IMDS notice again; a directive stays on the node item until cleared; the
controller may send the same interruption as a directive that IMDS already showed. The store keys
each notice by its id when it has one (directives) and by a hash of what it says otherwise (IMDS
notices carry no id), and hands each key on once.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace

from agent.monitors import Notice, NoticeKind

# EC2 gives a two-minute warning; when a notice has no usable time we assume the whole window.
SPOT_WINDOW_S = 120.0


def notice_key(notice: Notice) -> str:
    if notice.notice_id:
        return f"{notice.kind.value}:{notice.notice_id}"
    content = json.dumps({"kind": notice.kind.value, "action": notice.action, "time": notice.time}, sort_keys=True)
    return f"{notice.kind.value}:sha256:{hashlib.sha256(content.encode()).hexdigest()[:16]}"


def deadline_for(notice: Notice, now: float) -> float | None:
    """When the checkpoint must be durable; None for notices that stop nothing (rebalance)."""
    if notice.deadline is not None:
        return notice.deadline
    if notice.kind is NoticeKind.SPOT_INTERRUPTION:
        # the action time is when EC2 acts; past or missing times leave us no more than the window
        if notice.time is not None and notice.time > now:
            return min(notice.time, now + SPOT_WINDOW_S)
        return now + SPOT_WINDOW_S if notice.time is None else now
    return None


class NoticeStore:
    def __init__(self) -> None:
        self._seen: dict[str, Notice] = {}

    def add(self, notice: Notice, now: float) -> Notice | None:
        """The notice with its deadline filled in if it is new; None for a duplicate."""
        key = notice_key(notice)
        if key in self._seen:
            return None
        stored = replace(notice, deadline=deadline_for(notice, now))
        self._seen[key] = stored
        return stored

    def __len__(self) -> int:
        return len(self._seen)

    def seen(self, notice: Notice) -> bool:
        return notice_key(notice) in self._seen
