"""The fast local tier: step folders on NVMe/FSx, the manifest, the ``latest`` pointer, pruning."""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

from agent.checkpoint.manifest import (
    LATEST,
    MANIFEST,
    MAX_MANIFEST_BYTES,
    Manifest,
    RankPart,
    parse_step,
    part_name,
    read_manifest,
    same_step,
    step_name,
    verify,
)
from spotrelay.contracts.control import write_atomic
from spotrelay.errors import CorruptCheckpointError

log = logging.getLogger("spotrelay.checkpoint")


class LocalTier:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def step_dir(self, step: int) -> Path:
        return self.root / step_name(step)

    # --- writing -------------------------------------------------------------------------------
    def write_part(self, part: RankPart) -> None:
        write_atomic(self.step_dir(part.step) / part_name(part.rank), part.model_dump_json())

    def read_parts(self, step: int, ranks: range | list[int]) -> list[RankPart] | None:
        """The parts of ``ranks`` for ``step``, or None while any is still missing."""
        parts = []
        for rank in ranks:
            path = self.step_dir(step) / part_name(rank)
            if not path.is_file():
                return None
            parts.append(RankPart.model_validate_json(path.read_text()))
        return parts

    def wait_parts(self, step: int, ranks: range | list[int], timeout: float) -> list[RankPart]:
        end = time.monotonic() + timeout
        while (parts := self.read_parts(step, ranks)) is None:
            if time.monotonic() > end:
                raise TimeoutError(f"{step_name(step)}: parts of ranks {list(ranks)} not all written")
            time.sleep(0.02)
        return parts

    def commit(self, manifest: Manifest) -> None:
        """Manifest first, then the pointer: a crash between them leaves a usable step, not a lie."""
        write_atomic(self.step_dir(manifest.step) / MANIFEST, manifest.model_dump_json(indent=1))
        current = self.latest()
        if current is None or manifest.step >= current:
            write_atomic(self.root / LATEST, step_name(manifest.step) + "\n")

    # --- reading -------------------------------------------------------------------------------
    def latest(self) -> int | None:
        try:
            return parse_step((self.root / LATEST).read_text().strip())
        except FileNotFoundError:
            return None

    def steps(self) -> list[int]:
        """Step folders that hold a manifest, newest first (others are unfinished and ignored)."""
        if not self.root.is_dir():
            return []
        found = []
        for child in self.root.iterdir():
            step = parse_step(child.name)
            if step is not None and (child / MANIFEST).is_file():
                found.append(step)
        return sorted(found, reverse=True)

    def manifest(self, step: int) -> Manifest:
        path = self.step_dir(step) / MANIFEST
        try:
            with path.open("rb") as fh:  # bounded: a hostile file must not fill memory
                manifest = read_manifest(fh.read(MAX_MANIFEST_BYTES + 1), str(path))
        except FileNotFoundError as exc:
            raise CorruptCheckpointError(f"{step_name(step)}: no manifest") from exc
        except OSError as exc:  # a folder named manifest.json, no permission
            raise CorruptCheckpointError(f"{path}: unreadable manifest ({exc.strerror or exc})") from exc
        return same_step(manifest, step, str(path))

    def verified(self, step: int) -> Manifest:
        manifest = self.manifest(step)
        if not manifest.complete:
            raise CorruptCheckpointError(f"{step_name(step)}: local copy holds ranks {manifest.ranks} only")
        verify(self.step_dir(step), manifest)
        return manifest

    # --- retention -----------------------------------------------------------------------------
    def prune(self, keep: int, protect: set[int] | None = None) -> list[int]:
        """Delete committed steps beyond the newest ``keep`` and unfinished folders older than them."""
        committed = self.steps()
        keep_steps = set(committed[:keep]) | (protect or set())
        oldest_kept = min(committed[:keep], default=None)
        removed = []
        for child in self.root.iterdir() if self.root.is_dir() else []:
            step = parse_step(child.name)
            if step is None or step in keep_steps:
                continue
            if step in committed or (oldest_kept is not None and step < oldest_kept):
                shutil.rmtree(child, ignore_errors=True)
                removed.append(step)
        if removed:
            log.info("pruned local checkpoints %s (keep %d)", sorted(removed), keep)
        return sorted(removed)
