"""Keep the terminal for the twin's own view: everything the in-process controller, moto and the
libraries write to stdout/stderr goes to a log file instead.

File-descriptor redirection catches what logging configuration cannot: Powertools loggers built at
import time, werkzeug's request log, warnings and stray prints.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import TextIO

_terminal: TextIO | None = None
_terminal_err: TextIO | None = None  # the terminal's stderr, for the CLI's one-line error once fd 2 is the log


def quiet_logs(path: Path) -> TextIO:
    """Send fds 1 and 2 to ``path``; return a stream that still reaches the terminal."""
    global _terminal, _terminal_err
    if _terminal is not None:
        return _terminal
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    _terminal = os.fdopen(os.dup(1), "w", buffering=1)
    _terminal_err = os.fdopen(os.dup(2), "w", buffering=1)
    log_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return _terminal


def terminal() -> TextIO:
    return _terminal or sys.stdout


def terminal_err() -> TextIO | None:
    """The terminal's stderr once ``quiet_logs`` sent fd 2 to the log (None before: fd 2 is it)."""
    return _terminal_err
