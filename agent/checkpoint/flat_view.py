"""A 1-D tensor made of pieces that are never joined: slices of memory-mapped checkpoint files.

Resuming DeepSpeed at another world size needs, on each rank, only the slices of each saved tensor
that its new partition covers (plus the whole fp32 weights on ZeRO-1/2). A :class:`FlatView` lists
where those values lie (views into the saved partitions, which ``arena_files.load(lazy=True)`` maps
without reading) and copies just the asked range: the bytes a rank reads and copies are its share,
not the whole checkpoint (bench/resize.py measures it).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

import torch

from spotrelay.errors import CorruptCheckpointError


class FlatView:
    """The concatenation of 1-D ``pieces`` (views, not copies), read by range."""

    def __init__(self, pieces: Sequence[torch.Tensor]) -> None:
        self.pieces = [p.reshape(-1) for p in pieces if p.numel()]
        self.starts: list[int] = []
        total = 0
        for piece in self.pieces:
            self.starts.append(total)
            total += piece.numel()
        self.numel = total
        self.dtype = self.pieces[0].dtype if self.pieces else torch.float32

    def slice(self, start: int, length: int) -> FlatView:
        """Values ``[start, start + length)`` clipped to the end, still as views."""
        end = min(start + length, self.numel)
        found: list[torch.Tensor] = []
        i = max(bisect.bisect_right(self.starts, start) - 1, 0)
        while i < len(self.pieces) and start < end:
            piece, at = self.pieces[i], self.starts[i]
            lo, hi = max(start - at, 0), min(end - at, piece.numel())
            if hi > lo:
                found.append(piece.narrow(0, lo, hi - lo))
            start = max(start, at + piece.numel())
            i += 1
        return FlatView(found)

    def copy_into(self, start: int, out: torch.Tensor) -> None:
        """Copy values ``[start, start + out.numel())`` into ``out`` (1-D, any dtype)."""
        at = 0
        for piece in self.slice(start, out.numel()).pieces:
            out.narrow(0, at, piece.numel()).copy_(piece)
            at += piece.numel()
        if at != out.numel():
            raise CorruptCheckpointError(f"asked for {out.numel()} values at {start}, the partitions hold {at}")

    def whole(self, name: str, shape: Sequence[int]) -> torch.Tensor:
        """Every value, joined (a copy) and shaped; the count must match the shape."""
        if self.numel != math.prod(shape):
            raise CorruptCheckpointError(f"{name}: the partitions hold {self.numel} values, the shape {tuple(shape)}")
        out = torch.empty(self.numel, dtype=self.dtype)
        self.copy_into(0, out)
        return out.reshape(tuple(shape))


def joined(views: Sequence[FlatView]) -> FlatView:
    """Views one after the other (a parameter's fragments in rank order)."""
    return FlatView([piece for view in views for piece in view.pieces])
