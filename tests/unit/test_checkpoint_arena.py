"""Snapshot arenas and the raw DCP storage layer: round trip, layout, corruption and safety."""

from __future__ import annotations

import hashlib
import io
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp

from agent.checkpoint import arena_files
from agent.checkpoint.arena import Arena, ArenaPool, arena_size
from agent.checkpoint.dcp_storage import ArenaStorageWriter, load
from agent.checkpoint.engines import ArenaFile
from agent.checkpoint.sources import ArenaSource, SourceStream
from agent.checkpoint.state import snapshot_tree
from agent.checkpoint.uploader import encode, transfer
from spotrelay.errors import CorruptCheckpointError, UnsafeCheckpointError
from tests.conftest import MaliciousPayload


def _live() -> dict[str, Any]:
    g = torch.Generator().manual_seed(7)
    return {
        "w": torch.randn(33, 17, generator=g),
        "half": torch.randn(5, generator=g).to(torch.bfloat16),
        "ids": torch.arange(10, dtype=torch.int64),
        "scalar": torch.tensor(3.5),
        "empty": torch.empty(0, 4),
        "lr": 0.001,
        "betas": (0.9, 0.999),
        "name": "adamw",
    }


def _save(live: dict[str, Any], folder: Path, pool: ThreadPoolExecutor) -> tuple[list[Any], Arena]:
    arena = Arena(arena_size(live))
    state = snapshot_tree(live, arena)
    writer = ArenaStorageWriter(folder / "model", arena)
    dcp.save(state, storage_writer=writer, no_dist=True)
    shards = transfer(folder, encode(folder, writer.outputs), rank=0, step=1, s3=None, pool=pool)
    return shards, arena


def _zeros_like(live: dict[str, Any]) -> dict[str, Any]:
    return {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else None for k, v in live.items()}


@pytest.fixture
def pool() -> Any:
    with ThreadPoolExecutor(2) as executor:
        yield executor


def test_round_trip_is_exact_and_tensors_come_from_the_arena(tmp_path: Path, pool: ThreadPoolExecutor) -> None:
    live = _live()
    shards, arena = _save(live, tmp_path, pool)
    names = {s.path for s in shards}
    assert names == {"model/__0_tensors.bin", "model/__0_objects.bin", "model/.metadata"}
    for shard in shards:  # what the helper hashed from memory is what landed on disk
        assert hashlib.sha256((tmp_path / shard.path).read_bytes()).hexdigest() == shard.sha256
    tensor_bytes = sum(v.numel() * v.element_size() for v in live.values() if isinstance(v, torch.Tensor))
    assert (tmp_path / "model/__0_tensors.bin").stat().st_size == tensor_bytes  # raw bytes, no pickle framing
    live["w"].add_(1)  # training goes on: the saved copy must not alias live memory
    loaded = _zeros_like(live)
    load(loaded, tmp_path / "model", no_dist=True)
    expected = _live()
    for key, value in expected.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(loaded[key], value) and loaded[key].dtype == value.dtype, key
        else:
            assert loaded[key] == value, key
    arena.close()


def test_a_tensor_outside_the_arena_is_written_with_the_objects(tmp_path: Path) -> None:
    outside = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()  # not contiguous, not in any arena
    writer = ArenaStorageWriter(tmp_path, None)
    dcp.save({"t": outside, "n": 5}, storage_writer=writer, no_dist=True)
    assert not any(isinstance(o, ArenaFile) for o in writer.outputs)
    loaded: dict[str, Any] = {"t": torch.zeros(4, 3), "n": None}
    load(loaded, tmp_path, no_dist=True)
    assert torch.equal(loaded["t"], outside) and loaded["n"] == 5


def test_a_malicious_object_item_is_refused_before_unpickling(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    state = {"w": torch.ones(2), "evil": MaliciousPayload(marker)}
    dcp.save(state, storage_writer=ArenaStorageWriter(tmp_path, None), no_dist=True)
    with pytest.raises(UnsafeCheckpointError, match=r"system"):
        load({"w": torch.zeros(2), "evil": None}, tmp_path, no_dist=True)
    assert not marker.exists()


def test_a_truncated_tensor_file_is_a_corrupt_checkpoint(tmp_path: Path, pool: ThreadPoolExecutor) -> None:
    live = _live()
    _, arena = _save(live, tmp_path, pool)
    path = tmp_path / "model/__0_tensors.bin"
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(CorruptCheckpointError, match="ends before"):
        load(_zeros_like(live), tmp_path / "model", no_dist=True)
    arena.close()


def test_arena_source_reads_across_segments_and_writes_the_file(tmp_path: Path) -> None:
    arena = Arena(256)
    arena.bytes.copy_(torch.arange(256, dtype=torch.int64).to(torch.uint8))
    source = ArenaSource(tmp_path / "f.bin", arena.path, [(10, 20), (100, 30), (0, 5)])
    expected = bytes(range(10, 30)) + bytes(range(100, 130)) + bytes(range(5))
    assert source.size == 55
    assert bytes(source.read(15, 30)) == expected[15:45]
    source.write_local()
    assert (tmp_path / "f.bin").read_bytes() == expected
    source.close()
    arena.close()


def test_pool_reuses_a_free_arena_and_adds_one_only_while_busy() -> None:
    pool = ArenaPool()
    first = pool.acquire(1000)
    second = pool.acquire(1000)  # the first is still being written: a new one
    assert second is not first
    pool.release(first)
    assert pool.acquire(800) is first  # free and big enough: reused, memory already mapped
    pool.release(second)
    pool.close()


def test_stream_hashes_what_it_reads_front_to_back_and_only_then(tmp_path: Path) -> None:
    arena = Arena(4096)
    arena.bytes.copy_(torch.randint(0, 256, (4096,), dtype=torch.int64).to(torch.uint8))
    source = ArenaSource(tmp_path / "s.bin", arena.path, [(64, 1000), (2048, 1500)])
    expected = bytes(source.read(0, source.size))
    stream = SourceStream(source)
    assert stream.seek(0, io.SEEK_END) == 2500 and stream.seek(0) == 0
    assert b"".join(iter(lambda: stream.read(700), b"")) == expected
    assert stream.hexdigest() == hashlib.sha256(expected).hexdigest()
    jumpy = SourceStream(source)
    jumpy.seek(800)
    jumpy.read(100)
    assert jumpy.hexdigest() is None  # not read in order: the caller hashes the source itself
    source.close()
    arena.close()


def _write_skeleton_file(tree: Any, path: Path, pool: ThreadPoolExecutor) -> Arena:
    """What the DeepSpeed engine does per file: snapshot, skeleton via torch.save, tensors by the helper."""
    arena = Arena(arena_size(tree))
    skeleton, segments = arena_files.split(snapshot_tree(tree, arena), arena)
    torch.save(skeleton, path)
    outputs: list[Any] = [path]
    if segments:
        outputs.append(ArenaFile(path=arena_files.sidecar(path), arena=arena.path, segments=segments))
    transfer(path.parent, encode(path.parent, outputs), rank=0, step=1, s3=None, pool=pool)
    return arena


def test_deepspeed_style_file_round_trips_through_skeleton_and_tensors(
    tmp_path: Path, pool: ThreadPoolExecutor
) -> None:
    tree = {
        "module": OrderedDict(w=torch.nn.Parameter(torch.randn(4, 3)), b=torch.randn(3).to(torch.bfloat16)),
        "optimizer": {"state": {0: {"exp_avg": torch.randn(12), "step": torch.tensor(5)}}, "groups": [(0.9, 0.99)]},
        "empty": torch.empty(0, 2),
        "iteration": 7,
        "name": "zero",
    }
    path = tmp_path / "mp_rank_00_model_states.pt"
    arena = _write_skeleton_file(tree, path, pool)
    assert path.stat().st_size < 4096 and arena_files.sidecar(path).stat().st_size == 48 + 6 + 48 + 8
    loaded = arena_files.load(path, map_location="cpu")
    assert type(loaded["module"]) is OrderedDict and loaded["iteration"] == 7 and loaded["name"] == "zero"
    assert torch.equal(loaded["module"]["w"], tree["module"]["w"].detach())
    assert loaded["module"]["b"].dtype == torch.bfloat16 and torch.equal(loaded["module"]["b"], tree["module"]["b"])
    assert torch.equal(loaded["optimizer"]["state"][0]["exp_avg"], tree["optimizer"]["state"][0]["exp_avg"])
    assert loaded["optimizer"]["state"][0]["step"].item() == 5 and loaded["optimizer"]["groups"] == [(0.9, 0.99)]
    assert loaded["empty"].shape == (0, 2)
    arena_files.sidecar(path).write_bytes(b"\0" * 10)
    with pytest.raises(CorruptCheckpointError, match="shorter"):
        arena_files.load(path)
    arena.close()


def test_file_without_arena_tensors_and_plain_torch_files_load(tmp_path: Path, pool: ThreadPoolExecutor) -> None:
    path = tmp_path / "zero_pp_rank_1_mp_rank_00_model_states.pt"
    arena = _write_skeleton_file({"w": torch.empty(0), "step": 3}, path, pool)  # ZeRO-3: all placeholders
    assert not arena_files.sidecar(path).exists()
    assert arena_files.load(path)["step"] == 3
    plain = tmp_path / "plain.pt"
    torch.save({"w": torch.ones(2)}, plain)
    assert torch.equal(arena_files.load(plain)["w"], torch.ones(2))
    arena.close()


def test_a_malicious_skeleton_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    torch.save({"format": arena_files.FORMAT, "tree": MaliciousPayload(marker), "tensors": []}, path)
    with pytest.raises(UnsafeCheckpointError):
        arena_files.load(path)
    assert not marker.exists()
