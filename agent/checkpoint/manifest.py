"""The commit protocol's records: shards with size and sha256, per-rank parts, the manifest.

A step folder ``step-<N>/`` counts only once its ``manifest.json`` exists and every shard it
lists has the recorded size and sha256. Each rank first writes ``parts/rank-<R>.json`` (its own
shards, after they are durable); a committer writes the manifest from all parts, then moves
the ``latest`` pointer.

Format 2 (this one): ``samples`` is what the whole run trained on, all ranks together, so it means
the same at every world size. Format 1 recorded rank 0's own count, which a resize made meaningless;
reading one converts it (``legacy_global_samples``), so old checkpoints still load.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agent.checkpoint.sources import FileSource, sha256_source
from spotrelay.errors import CorruptCheckpointError

MANIFEST = "manifest.json"
LATEST = "latest"
PARTS_DIR = "parts"
FORMAT = 2
_STEP_RE = re.compile(r"^step-(\d{8,})$")


def step_name(step: int) -> str:
    return f"step-{step:08d}"


def parse_step(name: str) -> int | None:
    match = _STEP_RE.match(name)
    return int(match.group(1)) if match else None


def part_name(rank: int) -> str:
    return f"{PARTS_DIR}/rank-{rank}.json"


class Shard(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str  # relative to the step folder, POSIX separators
    size: int
    sha256: str
    rank: int


class RankPart(BaseModel):
    """What one rank wrote for one step; written only after its shards are durable."""

    model_config = ConfigDict(extra="forbid")
    step: int
    rank: int
    shards: list[Shard]


def legacy_global_samples(samples: int, step: int, world_size: int, global_batch: int | None) -> int:
    """The global sample count a format-1 record stands for: with a batch plan every step trained
    ``global_batch`` samples; without one, ``samples`` was one rank's count (ranks alike)."""
    return step * int(global_batch) if global_batch else samples * world_size


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    format: int = FORMAT
    job_id: str = ""
    step: int
    samples: int = 0  # trained on by all ranks together, since step 0 (format 2)
    engine: str  # "deepspeed" | "dcp"
    world_size: int
    ranks: list[int]  # ranks whose shards are listed (all of them in a complete checkpoint)
    layout: dict[str, int] = Field(default_factory=dict)  # dp/tp/pp sizes
    zero_stage: int = 0
    data_state: dict[str, Any] = Field(default_factory=dict)
    spec_hash: str = ""
    code_hash: str = ""
    request_id: str | None = None
    created: float = 0.0
    shards: list[Shard]

    @model_validator(mode="before")
    @classmethod
    def _global_samples(cls, data: Any) -> Any:
        if not isinstance(data, dict) or int(data.get("format", FORMAT)) >= 2 or "samples" not in data:
            return data
        state = data.get("data_state") or {}
        total = legacy_global_samples(int(data["samples"]), int(data.get("step", 0)), int(data.get("world_size", 1)),
                                      state.get("global_batch"))  # fmt: skip
        if "samples" in state:
            state = {**state, "samples": total}
        return {**data, "samples": total, "data_state": state}

    @property
    def complete(self) -> bool:
        return sorted(self.ranks) == list(range(self.world_size))

    @property
    def total_bytes(self) -> int:
        return sum(s.size for s in self.shards)


def sha256_file(path: Path) -> tuple[int, str]:
    source = FileSource(path)
    try:
        return source.size, sha256_source(source)
    finally:
        source.close()


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def merge_parts(parts: Iterable[RankPart]) -> tuple[list[int], list[Shard]]:
    """Ranks covered and shards, deduplicated by path (ranks on a shared folder may overlap)."""
    ranks: set[int] = set()
    by_path: dict[str, Shard] = {}
    for part in parts:
        ranks.add(part.rank)
        for shard in part.shards:
            by_path.setdefault(shard.path, shard)
    return sorted(ranks), sorted(by_path.values(), key=lambda s: s.path)


def verify(step_dir: Path, manifest: Manifest) -> None:
    """Raise CorruptCheckpointError naming the first missing, short or altered shard."""
    for shard in manifest.shards:
        path = step_dir / shard.path
        if not path.is_file():
            raise CorruptCheckpointError(f"{step_dir.name}: shard {shard.path} is missing")
        if path.stat().st_size != shard.size:
            raise CorruptCheckpointError(
                f"{step_dir.name}: shard {shard.path} has {path.stat().st_size} bytes, manifest says {shard.size}"
            )
        if sha256_file(path)[1] != shard.sha256:
            raise CorruptCheckpointError(f"{step_dir.name}: shard {shard.path} fails its sha256 check")


def read_manifest(text: str, source: str) -> Manifest:
    try:
        return Manifest.model_validate_json(text)
    except ValueError as exc:
        raise CorruptCheckpointError(f"{source}: unreadable manifest ({exc.__class__.__name__})") from exc
