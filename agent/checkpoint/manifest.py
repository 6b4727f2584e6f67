"""The commit protocol's records: shards with size and sha256, per-rank parts, the manifest.

A step folder ``step-<N>/`` counts only once its ``manifest.json`` exists and every shard it
lists has the recorded size and sha256. Each rank first writes ``parts/rank-<R>.json`` (its own
shards, after they are durable); a committer writes the manifest from all parts, then moves
the ``latest`` pointer.

Format 2 (this one): ``samples`` is what the whole run trained on, all ranks together, so it means
the same at every world size. Format 1 recorded rank 0's own count, which a resize made meaningless;
reading one converts it (``legacy_global_samples``), so old checkpoints still load. A manifest of a
newer format than ``READS`` is refused (CheckpointFormatError), never read as corrupt: skipping it
would resume from older work. Every field is bounded and typed, shard paths stay inside the step
folder: a hostile manifest is a CorruptCheckpointError naming the file and the field.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from pathlib import Path, PurePosixPath
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from agent.checkpoint.sources import FileSource, sha256_source
from spotrelay.errors import CheckpointFormatError, CorruptCheckpointError, validation_message

MANIFEST = "manifest.json"
LATEST = "latest"
PARTS_DIR = "parts"
FORMAT = 2
READS = (1, 2)  # the manifest formats this version reads
MAX_MANIFEST_BYTES = 64 << 20  # ~300k shards; a larger file is not one of ours
MAX_WORLD = 1 << 20  # ``complete`` lists range(world_size): a hostile size must not exhaust memory
# Counters are int64 in torch and DeepSpeed: a larger value is not a step, sample or size we wrote.
Count = Annotated[int, Field(ge=0, le=(1 << 63) - 1)]
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
    size: Count
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    rank: int = Field(ge=0, lt=MAX_WORLD)

    @field_validator("path")
    @classmethod
    def _inside_the_step(cls, path: str) -> str:
        """Verify reads and a download writes ``<step folder>/<path>``: never outside it."""
        parts = PurePosixPath(path).parts
        if not parts or path.startswith("/") or "\\" in path or "\x00" in path or any(p in ("..", ".") for p in parts):
            raise ValueError(f"{path!r} is not a relative path inside the step folder")
        return path


class RankPart(BaseModel):
    """What one rank wrote for one step; written only after its shards are durable."""

    model_config = ConfigDict(extra="forbid")
    step: Count
    rank: int = Field(ge=0, lt=MAX_WORLD)
    shards: list[Shard]


def legacy_global_samples(samples: int, step: int, world_size: int, global_batch: int | None) -> int:
    """The global sample count a format-1 record stands for: with a batch plan every step trained
    ``global_batch`` samples; without one, ``samples`` was one rank's count (ranks alike)."""
    return step * int(global_batch) if global_batch else samples * world_size


# data_state keys the session reads back (others are kept as they are); None: no batch plan
_DATA_STATE_MIN = {"global_batch": 1, "micro_batch": 1, "epoch": 0, "step": 0, "samples": 0, "cursor": 0}


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    format: int = Field(FORMAT, ge=min(READS), le=max(READS))
    job_id: str = ""
    step: Count
    samples: Count = 0  # trained on by all ranks together, since step 0 (format 2)
    engine: str  # "deepspeed" | "dcp"
    world_size: int = Field(ge=1, le=MAX_WORLD)
    ranks: list[Annotated[int, Field(ge=0, lt=MAX_WORLD)]]  # ranks whose shards are listed (all: complete)
    layout: dict[str, Annotated[int, Field(ge=1, le=MAX_WORLD)]] = Field(default_factory=dict)  # dp/tp/pp sizes
    zero_stage: int = Field(0, ge=0, le=3)
    data_state: dict[str, Any] = Field(default_factory=dict)
    # the spec's training hash (spotrelay.spec.training_hash; the whole spec's before 5 December, or
    # when the session was given no training hash): what a resume is checked against (compat.py)
    spec_hash: str = ""
    code_hash: str = ""
    request_id: str | None = None
    created: float = 0.0
    shards: list[Shard]

    @model_validator(mode="before")
    @classmethod
    def _global_samples(cls, data: Any) -> Any:
        if not isinstance(data, dict) or data.get("format", FORMAT) != 1 or "samples" not in data:
            return data  # format 2, or fields of the wrong type, which the field checks then name
        state = data.get("data_state") or {}
        numbers = (data["samples"], data.get("step", 0), data.get("world_size", 1))
        if not all(type(n) is int for n in numbers) or not isinstance(state, dict):
            return data
        batch = state.get("global_batch")
        total = legacy_global_samples(*numbers, batch if type(batch) is int and batch > 0 else None)
        if "samples" in state:
            state = {**state, "samples": total}
        return {**data, "samples": total, "data_state": state}

    @field_validator("data_state")
    @classmethod
    def _data_state(cls, state: dict[str, Any]) -> dict[str, Any]:
        for key, least in _DATA_STATE_MIN.items():
            value = state.get(key)
            if value is not None and not (type(value) is int and least <= value < 1 << 63):
                raise ValueError(f"{key} is {repr(value)[:40]}, not an integer >= {least}")
        return state

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


def same_step(manifest: Manifest, step: int, source: str) -> Manifest:
    """A manifest copied into another step's folder would resume the wrong step under its name."""
    if manifest.step != step:
        raise CorruptCheckpointError(f"{source}: field step is {manifest.step}, the folder is {step_name(step)}")
    return manifest


def read_manifest(text: str | bytes, source: str) -> Manifest:
    """Parse a manifest. A newer format than this version reads raises CheckpointFormatError (the
    caller must not skip it for an older checkpoint); anything else wrong is CorruptCheckpointError
    naming the file and the first bad field (the caller falls back)."""
    if len(text) > MAX_MANIFEST_BYTES:
        raise CorruptCheckpointError(f"{source}: unreadable manifest (more than {MAX_MANIFEST_BYTES} bytes)")
    try:
        data = json.loads(text)
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, and a nesting too deep
        raise CorruptCheckpointError(f"{source}: unreadable manifest (not JSON: {exc})") from exc
    except RecursionError as exc:
        raise CorruptCheckpointError(f"{source}: unreadable manifest (nested too deeply)") from exc
    found = data.get("format") if isinstance(data, dict) else None
    if type(found) is int and found > max(READS):
        raise CheckpointFormatError(
            f"{source}: manifest format {found}, newer than this spotrelay reads (formats "
            f"{', '.join(map(str, READS))}); upgrade spotrelay to resume it (nothing was loaded or changed, and an "
            "older checkpoint is not used instead)"
        )
    try:
        return Manifest.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or "(the document)"
        raise CorruptCheckpointError(
            f"{source}: unreadable manifest: field {field}: {validation_message(first)} "
            f"(got {str(first.get('input'))[:60]!r})"
            + (f" and {exc.error_count() - 1} more" if exc.error_count() > 1 else "")
        ) from exc
