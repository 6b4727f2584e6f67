"""When each demo fault's phases happened, from what the nodes wrote (docs/local-twin.md, "Downtime").

Only real records count: the trainers' control events (``first_step``, ``resumed``,
``checkpoint_committed``, each stamped with its attempt and world size), the agents' JSON logs
(when a new node started its training command) and the twin's instance lifetimes (launch, boot,
notice, end). Launch tags are not used to place a node in an attempt: a survivor or a promoted spare
serves a later attempt than it was launched for.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spotrelay.contracts.control import TrainerEvent

# the agent's log lines (agent/daemon.py, agent/spare.py) that mark a new node's own start-up
LAUNCHING = "launching"
DRAIN_WAIT = "waiting for the previous gang"


@dataclass(frozen=True)
class Resumed:
    at: float  # the first step the next attempt finished at full size
    attempt: int
    from_step: int | None  # what that attempt's trainers restored (None: started fresh)


def resumed_after(events: list[TrainerEvent], attempt: int, after: float, any_size: bool = False) -> Resumed | None:
    """The first step finished at full size (``any_size``: at any size) by an attempt later than
    ``attempt``, after ``after``. Full size: the largest world any run of the job had."""
    full = max((e.world_size or 0 for e in events if e.kind == "first_step"), default=0)
    firsts = [e for e in events if e.kind == "first_step" and e.attempt is not None and e.attempt > attempt
              and (any_size or e.world_size == full) and e.time >= after]  # fmt: skip
    if not firsts:
        return None
    first = min(firsts, key=lambda e: e.time)
    restored = [e for e in events if e.kind == "resumed" and e.attempt == first.attempt and e.time <= first.time]
    return Resumed(first.time, first.attempt or 0, restored[0].step if restored else None)


def stop_after_notice(events: list[TrainerEvent], attempt: int) -> tuple[float | None, float | None, float | None]:
    """(training stopped, the final emergency commit, its deadline) for a notice in ``attempt``:
    the last emergency save started where training stopped."""
    commits = sorted((e for e in events if e.kind == "checkpoint_committed" and e.emergency
                      and e.attempt in (attempt, None)), key=lambda e: e.time)  # fmt: skip
    if commits:
        last = commits[-1]
        return last.time - last.duration_s, last.time, last.deadline
    stops = [e.time for e in events if e.kind == "stopping" and e.attempt in (attempt, None)]
    return (min(stops) if stops else None), None, None


def agent_start(work_dir: Path) -> tuple[float | None, float | None]:
    """(ready, started) for a node's first training command, from its agent log: ready when its agent
    had nothing of its own left to do (it began waiting for the old gang to drain; else = started)."""
    waiting = None
    try:
        lines = (work_dir / "agent.log").read_text(errors="replace").splitlines()
    except OSError:
        return None, None
    for line in lines:
        try:
            rec: dict[str, Any] = json.loads(line)
        except ValueError:
            continue
        msg, ts = str(rec.get("msg", "")), rec.get("ts")
        if not isinstance(ts, (int, float)):
            continue
        if msg.startswith(DRAIN_WAIT) and waiting is None:
            waiting = float(ts)
        elif msg == LAUNCHING:
            return (waiting if waiting is not None else float(ts)), float(ts)
    return None, None
