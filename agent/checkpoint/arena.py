"""Shared-memory snapshot arenas: the training thread copies state in, a helper process reads it out.

A snapshot copies every tensor of the state into one arena (an anonymous ``memfd`` mapped by
the trainer). The uploader helper maps the same memory through ``/proc/<pid>/fd/<n>`` and writes,
hashes and uploads the shard straight from it, so neither the file write nor the upload runs on
the trainer's GIL, and an emergency save goes to S3 without first landing on disk. A memfd dies
with the trainer, so a crash leaks nothing in ``/dev/shm``.

Arenas are reused from one snapshot to the next (memory already mapped costs one memcpy; fresh
memory also pays a page fault per 4 KiB); a second one exists only while the first is still
being written when the next save starts (an emergency during a periodic upload).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import tempfile
import threading
from collections.abc import Iterable
from typing import Any

import torch

from agent.checkpoint.state import is_dtensor, is_plain_tensor

ALIGN = 64  # each tensor starts on a cache line


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def tensor_nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def tree_tensors(obj: Any) -> Iterable[torch.Tensor]:
    """The plain tensors of a state tree, in the order ``snapshot_tree`` visits them."""
    if isinstance(obj, torch.Tensor) and is_plain_tensor(obj):
        yield obj
    elif is_dtensor(obj):
        yield obj.to_local()
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from tree_tensors(value)
    elif isinstance(obj, list) or (isinstance(obj, tuple) and not hasattr(obj, "_fields")):
        for value in obj:  # the containers map_tree rebuilds; a namedtuple is copied whole
            yield from tree_tensors(value)


def arena_size(obj: Any) -> int:
    return sum(_aligned(tensor_nbytes(t)) for t in tree_tensors(obj))


def add_segment(segments: list[tuple[int, int]], where: int, n: int) -> None:
    """Append (arena offset, length) to a file's segments, merged with the last one when adjacent."""
    if segments and sum(segments[-1]) == where:
        segments[-1] = (segments[-1][0], segments[-1][1] + n)
    else:
        segments.append((where, n))


class ArenaFull(RuntimeError):
    pass


class Arena:
    """One shared mapping; ``take`` hands out tensor views into it, front to back."""

    def __init__(self, size: int) -> None:
        self.size = max(size, ALIGN)
        self._file: str | None = None
        if hasattr(os, "memfd_create"):
            self.fd = os.memfd_create("spotrelay-snapshot", os.MFD_CLOEXEC)
        else:  # not Linux: a temporary file, removed on close
            self.fd, self._file = tempfile.mkstemp(prefix="spotrelay-arena-")
        os.ftruncate(self.fd, self.size)
        self._map = mmap.mmap(self.fd, self.size)
        self.bytes = torch.frombuffer(self._map, dtype=torch.uint8)
        self._base = self.bytes.data_ptr()
        self.used = 0
        self.busy = False

    @property
    def path(self) -> str:
        """What another process of this user opens to map the same memory."""
        return self._file or f"/proc/{os.getpid()}/fd/{self.fd}"

    def take(self, like: torch.Tensor) -> torch.Tensor:
        n = tensor_nbytes(like)
        if self.used + n > self.size:
            raise ArenaFull(f"snapshot arena of {self.size} bytes is full")
        view = self.bytes[self.used : self.used + n]
        self.used += _aligned(n)
        return view.view(like.dtype).view(like.shape) if n else torch.empty(like.shape, dtype=like.dtype)

    def offset_of(self, t: torch.Tensor) -> int | None:
        """Where a contiguous tensor's bytes start in the arena, or None if it lives elsewhere."""
        if t.device.type != "cpu" or not t.is_contiguous() or t.numel() == 0:
            return None
        offset = t.data_ptr() - self._base
        return offset if offset >= 0 and offset + tensor_nbytes(t) <= self.size else None

    def close(self) -> None:
        del self.bytes  # the tensor holds an export of the mapping; drop it before closing
        with contextlib.suppress(BufferError):  # a snapshot still alive keeps it mapped until collected
            self._map.close()
        os.close(self.fd)
        if self._file:
            with contextlib.suppress(OSError):
                os.unlink(self._file)


class ArenaPool:
    """Arenas sized to the state; ``acquire`` returns the smallest free one big enough, or a new one.

    Arenas live until ``close``: a run's state has the same shapes from one save to the next."""

    def __init__(self) -> None:
        self._arenas: list[Arena] = []
        self._lock = threading.Lock()

    def acquire(self, size: int) -> Arena:
        with self._lock:
            fits = [a for a in self._arenas if not a.busy and a.size >= size]
            if fits:  # best fit: DeepSpeed saves files of different sizes, each into its own arena
                arena = min(fits, key=lambda a: a.size)
            else:
                arena = Arena(size)
                self._arenas.append(arena)
            arena.busy, arena.used = True, 0
            return arena

    def release(self, arena: Arena) -> None:
        with self._lock:
            arena.busy = False

    def close(self) -> None:
        with self._lock:
            for arena in self._arenas:
                arena.close()
            self._arenas.clear()
