"""FlatView: ranges of a tensor kept as pieces (a resharded DeepSpeed resume reads only its slices)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agent.checkpoint import arena_files
from agent.checkpoint.flat_view import FlatView, joined
from spotrelay.errors import CorruptCheckpointError

WHOLE = torch.arange(23, dtype=torch.float32)
VIEW = FlatView([WHOLE[:5], WHOLE[5:5], WHOLE[5:14], WHOLE[14:]])  # an empty piece too


@pytest.mark.parametrize(("start", "length"), [(0, 23), (0, 5), (3, 9), (5, 9), (13, 10), (20, 10), (23, 4)])
def test_a_slice_and_a_copy_give_the_same_values_as_the_joined_tensor(start: int, length: int) -> None:
    part = VIEW.slice(start, length)
    expected = WHOLE[start:start + length]
    assert part.numel == expected.numel()
    out = torch.empty(expected.numel(), dtype=torch.float64)  # cast on the way, as lp.data.copy_ does
    VIEW.copy_into(start, out)
    assert torch.equal(out, expected.double())
    assert all(p.untyped_storage().data_ptr() == WHOLE.untyped_storage().data_ptr() for p in part.pieces)  # views


def test_joined_views_and_whole_shapes() -> None:
    both = joined([VIEW.slice(20, 3), VIEW.slice(0, 4)])
    assert torch.equal(both.whole("p", (7,)), torch.cat([WHOLE[20:], WHOLE[:4]]))
    with pytest.raises(CorruptCheckpointError, match="p: the partitions hold 7 values"):
        both.whole("p", (2, 4))
    with pytest.raises(CorruptCheckpointError, match="asked for 9 values"):
        VIEW.copy_into(20, torch.empty(9))


def _write(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """A skeleton + raw tensor file, as the uploader helper leaves it (agent/checkpoint/arena_files.py)."""
    specs, raw, tree = [], b"", {}
    for name, t in tensors.items():
        data = t.contiguous().numpy().tobytes()
        specs.append({"offset": len(raw), "nbytes": len(data), "dtype": str(t.dtype).removeprefix("torch."),
                      "shape": list(t.shape)})
        tree[name] = {arena_files.MARK: len(specs) - 1}
        raw += data
    torch.save({"format": arena_files.FORMAT, "tree": {**tree, "n": 3}, "tensors": specs}, path)
    arena_files.sidecar(path).write_bytes(raw)


def test_a_lazy_load_maps_the_tensor_file_and_reads_the_same_values(tmp_path: Path) -> None:
    a, c = torch.randn(1000), torch.arange(12, dtype=torch.int64).reshape(3, 4)
    path = tmp_path / "optim.pt"
    _write(path, {"a": a, "c": c})
    lazy = arena_files.load(path, lazy=True)
    assert torch.equal(lazy["a"], a) and torch.equal(lazy["c"], c) and lazy["n"] == 3
    lazy["a"].zero_()  # a private mapping: the loaded tensors are writable, the file never changes
    assert torch.equal(arena_files.load(path)["a"], a)
    with open(arena_files.sidecar(path), "r+b") as fh:
        fh.truncate(100)
    with pytest.raises(CorruptCheckpointError, match="shorter than"):
        arena_files.load(path, lazy=True)
