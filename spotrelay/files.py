"""Reading a file the user named, whatever it turns out to be."""

from __future__ import annotations

import os
from pathlib import Path


def read_bounded(path: str | Path, limit: int) -> bytes:
    """Up to ``limit + 1`` bytes of ``path`` (more than ``limit``: the caller refuses it by name, so a
    device or a pipe that never ends is not read for ever). Opened without blocking: a named pipe that
    nothing writes to reads as empty instead of waiting in open() for a writer that never comes (the
    blocking is restored for the reads, so a pipe that is being written, ``<(zcat x.gz)``, is read whole)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        os.set_blocking(fd, True)
        return f.read(limit + 1)
