"""The end of a failing rank's output, sent with TrainingExited so the cause outlives the node.

The per-rank wrapper (``agent.launcher.worker_main``) records the traceback of an exception that
ends the script in its exit record; that is the failing rank's own output, whatever the other
ranks printed. A script that exits with a code after printing its complaint, or a ``command`` run
without the wrapper, has no record: then the end of the node's training log stands in. Bounded to
``MAX_OUTPUT_TAIL`` characters and ``TAIL_LINES`` lines: enough for a traceback's last frames and
its message, never the whole log.
"""

from __future__ import annotations

import json
from pathlib import Path

from spotrelay.contracts.events import MAX_OUTPUT_TAIL
from spotrelay.contracts.exit_codes import ExitCode

TAIL_LINES = 25
READ_BYTES = 32 * 1024
_QUIET = {int(ExitCode.DONE), int(ExitCode.PREEMPTED_SAVED), int(ExitCode.PREEMPTED_UNSAVED),
          int(ExitCode.CANCELLED)}


def bound(text: str, max_chars: int = MAX_OUTPUT_TAIL) -> str:
    lines = [line.rstrip() for line in text.strip().splitlines()][-TAIL_LINES:]
    out = "\n".join(lines)
    return out if len(out) <= max_chars else "..." + out[-(max_chars - 3):]


def recorded_error(exit_dir: Path) -> str:
    """The first failing rank's recorded traceback (lowest rank), or ''."""
    found: list[tuple[int, str]] = []
    for path in exit_dir.glob("rank-*.json"):
        try:
            record = json.loads(path.read_text())
            if int(record["code"]) not in _QUIET and record.get("error"):
                found.append((int(record["rank"]), str(record["error"])))
        except (OSError, ValueError, KeyError):
            continue
    return min(found)[1] if found else ""


def log_end(log: Path) -> str:
    try:
        with open(log, "rb") as fh:
            fh.seek(max(0, fh.seek(0, 2) - READ_BYTES))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


def failure_tail(exit_code: int, exit_dir: Path, log: Path) -> str:
    """What to quote for an attempt that ended with ``exit_code`` ('' when it did not fail)."""
    if exit_code in _QUIET:
        return ""
    return bound(recorded_error(exit_dir) or log_end(log))
