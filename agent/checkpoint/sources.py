"""Where a shard's bytes are read from while it is hashed and uploaded: a file, or a snapshot arena.

An ``ArenaSource`` maps the trainer's shared memory (read-only) and also writes the shard to the
local tier; hashing and the S3 upload read the memory directly, so nothing waits for the disk.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import mmap
import os
from pathlib import Path
from typing import Any, Protocol

CHUNK = 8 << 20


class Source(Protocol):
    path: Path  # the shard in the local tier
    size: int

    def read(self, offset: int, length: int) -> bytes | memoryview: ...

    def close(self) -> None: ...


class FileSource:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDONLY)
        self.size = os.fstat(self._fd).st_size

    def read(self, offset: int, length: int) -> bytes:
        return os.pread(self._fd, length, offset)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class ArenaSource:
    """A shard laid out as ``segments`` (arena offset, length) of a mapped arena, in file order."""

    def __init__(self, path: Path, arena: str, segments: list[tuple[int, int]]) -> None:
        self.path, self.segments = path, segments
        self.size = sum(length for _, length in segments)
        fd = os.open(arena, os.O_RDONLY)
        try:
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            self._map = mmap.mmap(fd, 0, flags=flags, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        self._view = memoryview(self._map)
        end = max((start + length for start, length in segments), default=0)
        if end > len(self._map):
            raise ValueError(f"{path.name}: segments end at {end}, the arena holds {len(self._map)} bytes")
        self._starts = []  # file offset of each segment
        pos = 0
        for _, length in segments:
            self._starts.append(pos)
            pos += length

    def read(self, offset: int, length: int) -> bytes | memoryview:
        """The bytes at [offset, offset+length) of the shard: a view when one segment holds them."""
        pieces: list[memoryview] = []
        for (start, seg_len), file_pos in zip(self.segments, self._starts, strict=True):
            lo, hi = max(offset, file_pos), min(offset + length, file_pos + seg_len)
            if lo < hi:
                pieces.append(self._view[start + lo - file_pos : start + hi - file_pos])
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def write_local(self) -> None:
        """Write the shard to the local tier (page cache; the caller fsyncs)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "wb") as fh:
            for start, length in self.segments:
                fh.write(self._view[start : start + length])

    def close(self) -> None:
        with contextlib.suppress(BufferError):  # a slice still referenced keeps it until collected
            self._view.release()
            self._map.close()


def sha256_source(source: Source) -> str:
    digest = hashlib.sha256()
    for offset in range(0, source.size, CHUNK):
        digest.update(source.read(offset, min(CHUNK, source.size - offset)))
    return digest.hexdigest()


class SourceStream(io.RawIOBase):
    """A read-only, seekable file object over a source (what s3transfer's uploader reads).

    It sha256s the bytes as they are read, as long as they are read front to back (s3transfer
    reads a stream's parts in order): one pass over memory for the upload and the hash.
    ``hexdigest`` is None if the reads skipped around; then hash the source separately.
    """

    def __init__(self, source: Source) -> None:
        super().__init__()
        self.source, self.pos = source, 0
        self._digest, self._hashed = hashlib.sha256(), 0

    def hexdigest(self) -> str | None:
        return self._digest.hexdigest() if self._hashed == self.source.size else None

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.source.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def read(self, size: int | None = -1) -> bytes:
        """One copy out of the arena (RawIOBase's default would copy twice)."""
        n = self.source.size - self.pos if size is None or size < 0 else size
        n = max(0, min(n, self.source.size - self.pos))
        data = bytes(self.source.read(self.pos, n)) if n else b""
        self._account(data)
        return data

    def _account(self, data: bytes | memoryview) -> None:
        if self.pos == self._hashed:
            self._digest.update(data)
            self._hashed += len(data)
        self.pos += len(data)

    def readinto(self, buffer: Any) -> int:
        n = max(0, min(len(buffer), self.source.size - self.pos))
        if n:
            view = memoryview(buffer).cast("B")[:n]
            view[:] = self.source.read(self.pos, n)
            self._account(view)
        return n
