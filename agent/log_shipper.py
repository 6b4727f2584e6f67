"""Ship the training output off the node: the log must outlive the instance.

Every few seconds the agent sends the complete new lines of ``train-a<N>.log`` to CloudWatch Logs
(group ``SPOTRELAY_LOG_GROUP``, stream ``<job>/a<attempt>-r<rank>``, created by the stacks and
the node's role), and once more when the attempt ends. A failed send keeps its lines for the next
try; shipping never stops training. Without a log group (the local twin) nothing is shipped:
``spotrelay logs --dir`` reads the node's files.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from agent.reporting import warn

MAX_READ = 4 * 1024 * 1024  # per ship: a burst of output is sent over several calls
SHIP_EVERY_S = 5.0


class LogSink(Protocol):
    def put(self, job_id: str, attempt: int, rank: int, lines: list[tuple[int, str]]) -> None: ...


class LogShipper:
    def __init__(self, sink: LogSink, job_id: str, attempt: int, rank: int, path: Path,
                 clock: Callable[[], float] = time.time) -> None:  # fmt: skip
        self.sink, self.job_id, self.attempt, self.rank, self.path = sink, job_id, attempt, rank, path
        self.clock = clock
        self.offset = path.stat().st_size if path.exists() else 0  # an earlier attempt's lines are shipped
        self._next = 0.0
        self.shipped = 0

    def tick(self, now: float) -> None:
        if now >= self._next:
            self._next = now + SHIP_EVERY_S
            self.ship()

    def ship(self, final: bool = False) -> None:
        """Send the complete new lines (and, at the end, a last partial one)."""
        while True:
            try:
                with open(self.path, "rb") as fh:
                    fh.seek(self.offset)
                    data = fh.read(MAX_READ)
            except FileNotFoundError:
                return
            end = len(data) if final else data.rfind(b"\n") + 1
            if end <= 0:
                return
            ms = int(self.clock() * 1000)
            lines = [(ms, line) for line in data[:end].decode(errors="replace").splitlines()]
            try:
                if lines:
                    self.sink.put(self.job_id, self.attempt, self.rank, lines)
            except Exception as exc:  # CloudWatch throttled or unreachable: try again next tick
                warn("log shipping failed", error=str(exc), lines=len(lines))
                return
            self.offset += end
            self.shipped += len(lines)
            if len(data) < MAX_READ:
                return
