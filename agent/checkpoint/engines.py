"""How model and optimizer state is snapshotted, written and loaded, per framework.

``snapshot`` runs on the training thread and only copies state into private CPU memory. The
``Snapshot`` it returns is written on the background thread (``write`` returns the files this
rank wrote, or left to the uploader helper as ``ArenaFile``s) and released once its files are
committed or the save failed, so its memory can hold the next snapshot.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from agent.checkpoint.manifest import Manifest


@dataclass(frozen=True)
class ArenaFile:
    """A shard still in shared memory: the (arena offset, length) segments, in file order."""

    path: Path
    arena: str  # a path another process of this user can map (``/proc/<pid>/fd/<n>``)
    segments: list[tuple[int, int]]

    @property
    def size(self) -> int:
        return sum(length for _, length in self.segments)


Output = Path | ArenaFile


def _nothing() -> None:
    return None


@dataclass
class Snapshot:
    write: Callable[[], list[Output]]
    release: Callable[[], None] = field(default=_nothing)


class Engine(Protocol):
    kind: str

    def snapshot(self, root: Path, step_dir: Path) -> Snapshot: ...

    def load(self, root: Path, step_dir: Path, manifest: Manifest) -> None:
        """Load ``step_dir`` (written by ``manifest.world_size`` ranks, maybe not this world's)."""
        ...

    def describe(self) -> dict[str, Any]:
        """``layout`` (dp/tp/pp) and ``zero_stage`` for the manifest."""
        ...

    def close(self) -> None: ...
