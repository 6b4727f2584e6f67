"""A ``torch.distributed.checkpoint`` storage layer that writes raw bytes from a snapshot arena.

DCP still plans the save (which rank writes which replica or shard, resharding metadata); we
only change where the bytes go. Per rank:

- ``__<R>_tensors.bin``: every tensor item, raw little-endian bytes back to back. The writer
  does not write it: it returns an ``ArenaFile`` (arena segments in file order) that the uploader
  helper writes, hashes and uploads from shared memory;
- ``__<R>_objects.bin``: the few non-tensor items (``torch.save`` bytes, as DCP makes them) and
  any tensor that is not in the arena; written here, it is small;
- rank 0 also writes ``.metadata`` (DCP's pickle; offsets point into the files above).

Reading never unpickles code: ``.metadata`` and every object item are scanned against the
allow-list first, tensors are rebuilt from raw bytes with ``torch.frombuffer``.
"""

from __future__ import annotations

import dataclasses
import io
import os
import pickle
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import _StorageInfo, _StoragePrefix
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    ReadItem,
    SavePlan,
    SavePlanner,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from agent.checkpoint.arena import Arena, add_segment, tensor_nbytes
from agent.checkpoint.engines import ArenaFile
from agent.checkpoint.safety import check_file, check_torch_bytes
from spotrelay.errors import CorruptCheckpointError, UnsafeCheckpointError

METADATA = ".metadata"


def _raw_bytes(t: torch.Tensor) -> bytes:
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    return bytes(flat.view(torch.uint8).numpy()) if flat.numel() else b""


class ArenaStorageWriter(StorageWriter):
    def __init__(self, path: Path, arena: Arena | None) -> None:
        super().__init__()
        self.path, self.arena = Path(path), arena
        self.save_id = uuid.uuid4().hex
        self.rank = 0
        self.outputs: list[Path | ArenaFile] = []  # what this rank wrote or left to the helper

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        if checkpoint_id:
            self.path = Path(checkpoint_id)
        self.save_id = uuid.uuid4().hex

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.rank = kwargs.get("rank") or 0

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        self.path.mkdir(parents=True, exist_ok=True)
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        return [dataclasses.replace(plan, storage_data=_StoragePrefix(f"__{i}_")) for i, plan in enumerate(plans)]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        prefix = cast(_StoragePrefix, plan.storage_data).prefix
        tensors_name, objects_name = f"{prefix}tensors.bin", f"{prefix}objects.bin"
        segments: list[tuple[int, int]] = []  # (arena offset, length); neighbours in the arena merge
        objects = bytearray()
        results, tensors_size = [], 0
        for item in plan.items:
            data = planner.resolve_data(item)
            if item.type == WriteItemType.BYTE_IO:
                raw = cast(io.BytesIO, data).getbuffer()
                info = _StorageInfo(objects_name, len(objects), len(raw))
                objects += raw
            else:
                tensor = cast(torch.Tensor, data)
                n = tensor_nbytes(tensor)
                where = self.arena.offset_of(tensor) if self.arena is not None else None
                if where is None:  # not snapshotted into the arena (e.g. a DTensor's local copy)
                    info = _StorageInfo(objects_name, len(objects), n)
                    objects += _raw_bytes(tensor)
                else:
                    info = _StorageInfo(tensors_name, tensors_size, n)
                    tensors_size += n
                    add_segment(segments, where, n)
            results.append(WriteResult(index=item.index, size_in_bytes=info.length, storage_data=info))
        if objects:
            with open(self.path / objects_name, "wb") as fh:
                fh.write(objects)
            self.outputs.append(self.path / objects_name)
        if segments:
            assert self.arena is not None
            self.outputs.append(ArenaFile(path=self.path / tensors_name, arena=self.arena.path, segments=segments))
        future: Future[list[WriteResult]] = Future()
        future.set_result(results)
        return future

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        metadata.storage_data = {r.index: r.storage_data for rank_results in results for r in rank_results}
        metadata.storage_meta = self.storage_meta()
        tmp = self.path / f"{METADATA}.tmp"
        with open(tmp, "wb") as fh:
            pickle.dump(metadata, fh)
        os.replace(tmp, self.path / METADATA)
        self.outputs.append(self.path / METADATA)

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=str(self.path), save_id=self.save_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return True


def load(state: dict[str, Any], path: Path, process_group: Any = None, no_dist: bool = False) -> None:
    """``dcp.load`` from our layout; a refusal or corruption is raised as itself, not wrapped."""
    try:
        dcp.load(state, storage_reader=RawStorageReader(path), process_group=process_group, no_dist=no_dist)
    except CheckpointException as exc:  # DCP wraps every rank's error in a BaseException
        for error, _trace in exc.failures.values():
            if isinstance(error, UnsafeCheckpointError | CorruptCheckpointError):
                raise error from None
        raise CorruptCheckpointError(f"{path}: {exc}") from None


def saved_layout(path: Path) -> tuple[dict[str, tuple[int, ...]], set[str]]:
    """(global shapes of the saved ``model.*`` tensors, every saved ``optim.*`` key), from the
    (scanned) metadata."""
    metadata = RawStorageReader(path).read_metadata()
    shapes = {
        key.removeprefix("model."): tuple(meta.size)
        for key, meta in metadata.state_dict_metadata.items()
        if key.startswith("model.") and isinstance(meta, TensorStorageMetadata)
    }
    return shapes, {key for key in metadata.state_dict_metadata if key.startswith("optim.")}


def _check_metadata(metadata: Any, source: Path) -> None:
    """Only allow-listed classes got this far; their fields may still be anything a pickle holds."""
    if not isinstance(metadata, Metadata):
        raise CorruptCheckpointError(f"{source}: holds a {type(metadata).__name__}, not DCP metadata")
    if not isinstance(metadata.state_dict_metadata, dict) or not isinstance(metadata.storage_data, dict | None):
        raise CorruptCheckpointError(f"{source}: field state_dict_metadata or storage_data is not a dict")
    for key, meta in metadata.state_dict_metadata.items():
        size = getattr(meta, "size", None)
        if isinstance(meta, TensorStorageMetadata) and not (
            isinstance(size, tuple) and all(type(n) is int and n >= 0 for n in size)
        ):
            raise CorruptCheckpointError(f"{source}: field {key}.size is {str(size)[:40]}, not a tensor shape")


class RawStorageReader(StorageReader):
    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = Path(path)
        self.metadata: Metadata | None = None

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        if checkpoint_id:
            self.path = Path(checkpoint_id)

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        source = self.path / METADATA
        check_file(source)  # DCP's metadata is a plain pickle: every global it names is allow-listed
        try:
            with open(source, "rb") as fh:
                metadata = pickle.load(fh)
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as exc:
            raise CorruptCheckpointError(f"{source}: not DCP metadata ({type(exc).__name__}: {exc})") from exc
        _check_metadata(metadata, source)
        if metadata.storage_meta is None:
            metadata.storage_meta = StorageMeta()
        return cast(Metadata, metadata)

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        if metadata.storage_data is None:
            raise CorruptCheckpointError(f"{self.path / METADATA}: no storage data")
        self.metadata = metadata

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        assert self.metadata is not None
        storage: dict[Any, _StorageInfo] = self.metadata.storage_data
        by_file: dict[str, list[ReadItem]] = {}
        for req in plan.items:
            by_file.setdefault(storage[req.storage_index].relative_path, []).append(req)
        for name, reqs in by_file.items():
            with self._open(name) as fh:
                for req in sorted(reqs, key=lambda r: storage[r.storage_index].offset):
                    info = storage[req.storage_index]
                    fh.seek(info.offset)
                    raw = bytearray(info.length)
                    if fh.readinto(raw) != info.length:
                        raise CorruptCheckpointError(f"{self.path / name}: ends before {req.storage_index.fqn}")
                    if req.type == LoadItemType.BYTE_IO:
                        check_torch_bytes(raw, f"{self.path / name}:{req.storage_index.fqn}")
                        planner.load_bytes(req, io.BytesIO(bytes(raw)))  # torch.load of bytes scanned above
                    else:
                        self._load_tensor(req, raw, planner)
        future: Future[None] = Future()
        future.set_result(None)
        return future

    @contextmanager
    def _open(self, name: str) -> Iterator[io.BufferedReader]:
        if "/" in name or name.startswith(".."):
            raise CorruptCheckpointError(f"{self.path / METADATA}: storage path {name!r} leaves the folder")
        with open(self.path / name, "rb") as fh:
            yield fh

    def _load_tensor(self, req: ReadItem, raw: bytearray, planner: LoadPlanner) -> None:
        assert self.metadata is not None
        meta = self.metadata.state_dict_metadata[req.storage_index.fqn]
        if not isinstance(meta, TensorStorageMetadata):
            raise CorruptCheckpointError(f"{self.path}: {req.storage_index.fqn} is not a tensor in the metadata")
        offset = req.storage_index.offset
        chunk = next((c for c in meta.chunks if offset is None or c.offsets == offset), None)
        if chunk is None:
            raise CorruptCheckpointError(f"{self.path}: no chunk of {req.storage_index.fqn} at {offset}")
        dtype = meta.properties.dtype
        numel = int(torch.Size(chunk.sizes).numel())
        if numel * torch.empty((), dtype=dtype).element_size() != len(raw):
            raise CorruptCheckpointError(f"{self.path}: {req.storage_index.fqn} has {len(raw)} bytes")
        saved = torch.frombuffer(raw, dtype=dtype) if numel else torch.empty(0, dtype=dtype)
        tensor = narrow_tensor_by_index(saved.reshape(chunk.sizes), req.storage_offsets, req.lengths)
        target = planner.resolve_tensor(req).detach()
        if target.size() != tensor.size():
            saved_shape, now = tuple(tensor.size()), tuple(target.size())
            raise CorruptCheckpointError(f"{req.storage_index.fqn}: saved {saved_shape}, now {now}")
        target.copy_(tensor)
        planner.commit_tensor(req, target)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return True
