"""The demo's live view: job, nodes and the latest events, drawn with Rich."""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from rich.console import Group
from rich.panel import Panel
from rich.table import Column, Table
from rich.text import Text

from spotrelay.domain.models import Job, Node
from spotrelay.local.compute import LocalInstance

NODE_COLUMNS = ("node", "instance", "pool", "controller", "process", "step")
STATUS_STYLE = {
    "RUNNING": "green",
    "SUCCEEDED": "bold green",
    "FAILED": "bold red",
    "CHECKPOINTING": "yellow",
    "RECOVERING": "magenta",
    "PLACING": "cyan",
    "PROVISIONING": "cyan",
    "STARTING": "cyan",
}


@dataclass
class EventLog:
    t0: float
    lines: deque[tuple[float, str, str]] = field(default_factory=lambda: deque(maxlen=400))
    total: int = 0  # lines ever added
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, text: str, style: str = "") -> None:
        with self._lock:
            self.lines.append((time.time(), text, style))
            self.total += 1

    def since(self, seen: int) -> tuple[list[tuple[float, str, str]], int]:
        """Lines added after the first ``seen`` (for printing as they come), and the new count."""
        with self._lock:
            new = min(self.total - seen, len(self.lines))
            return (list(self.lines)[-new:] if new > 0 else []), self.total

    def last(self, n: int) -> list[tuple[float, str, str]]:
        with self._lock:
            return list(self.lines)[-n:]

    def all(self) -> list[dict[str, Any]]:
        with self._lock:
            return [{"t": round(t - self.t0, 2), "event": text} for t, text, _ in self.lines]


def render(
    job: Job | None,
    nodes: list[Node],
    instances: list[LocalInstance],
    steps: dict[str, int | None],
    log: EventLog,
    elapsed: float,
    note: str,
) -> Group:
    # every cell folds onto more lines rather than end in "…" on a narrow terminal: ids are copied from here
    head = Table.grid(*(Column(overflow="fold") for _ in range(4)), padding=(0, 2))
    if job is None:
        head.add_row("job", "submitted; waiting for the controller", f"{elapsed:5.0f}s")
    else:
        ckpt = (
            f"step {job.last_checkpoint.step} ({time.time() - job.last_checkpoint.committed_at:.0f}s ago)"
            if job.last_checkpoint
            else "none yet"
        )
        step = max([s for s in steps.values() if s is not None], default=job.last_step)
        head.add_row("job", job.job_id, "status", Text(job.status.value, style=STATUS_STYLE.get(job.status.value, "")))
        head.add_row("attempt", str(job.attempt), "step", str(step))
        head.add_row("last checkpoint", ckpt, "elapsed", f"{elapsed:.0f}s")
        head.add_row("recoveries", str(job.recoveries), "steps lost", str(job.steps_lost))
    table = Table(*(Column(h, overflow="fold") for h in NODE_COLUMNS), expand=True)
    by_instance = {n.instance_id: n for n in nodes}
    for li in sorted(instances, key=lambda li: (li.launched_at, li.instance.rank))[-6:]:
        i = li.instance
        node = by_instance.get(i.instance_id)
        if li.ended_at is not None:
            proc = Text(li.end_reason or "gone", style="red" if li.end_reason == "killed" else "yellow")
        elif li.booted_at is None:
            proc = Text("booting", style="cyan")
        elif li.process is not None and li.process.poll() is not None:
            proc = Text(f"agent exited {li.process.returncode}")
        else:
            proc = Text("running" + (" (notice)" if li.notice_at else ""), style="green")
        table.add_row(
            f"a{i.attempt}-r{i.rank}",
            i.instance_id,
            f"{i.pool.az} {i.pool.instance_type} {i.pool.market}",
            node.state.value if node else "-",
            proc,
            str(steps.get(i.instance_id, "") or ""),
        )
    events = Table.grid(Column(no_wrap=True), Column(overflow="fold"))
    for t, text, style in log.last(10):
        events.add_row(Text(f"{t - log.t0:6.1f}s  ", style="dim"), Text(text, style=style))
    return Group(
        Panel(head, title="spotrelay demo: local twin", subtitle=note),
        Panel(table, title="nodes"),
        Panel(events, title="events"),
    )
