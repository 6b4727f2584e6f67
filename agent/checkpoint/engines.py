"""How model and optimizer state is snapshotted, written and loaded, per framework.

``snapshot`` runs on the training thread and only copies state into private CPU memory; the
writer it returns runs on the background thread and returns the files this rank wrote.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

Writer = Callable[[], list[Path]]


class Engine(Protocol):
    kind: str

    def snapshot(self, root: Path, step_dir: Path) -> Writer: ...

    def load(self, root: Path, step_dir: Path) -> None: ...

    def describe(self) -> dict[str, Any]:
        """``layout`` (dp/tp/pp) and ``zero_stage`` for the manifest."""
        ...

    def close(self) -> None: ...
