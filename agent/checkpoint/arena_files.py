"""Files whose tensors stay in a snapshot arena until the uploader helper writes them.

Used for DeepSpeed's files: each file DeepSpeed asks us to save becomes

- ``<name>``: a small ``torch.save`` skeleton, the state tree with every arena tensor replaced by
  ``{"__spotrelay_tensor__": i}`` plus the list of tensors (offset, bytes, dtype, shape);
- ``<name>.tensors``: the raw tensor bytes back to back, written, hashed and uploaded from shared
  memory by the helper (an ``ArenaFile``).

Loading reads the skeleton with ``weights_only=True`` and rebuilds the tensors from raw bytes; a
plain ``torch.save`` file (no skeleton) loads as it is.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path
from typing import Any

import torch

from agent.checkpoint.arena import Arena, add_segment, tensor_nbytes
from agent.checkpoint.safety import safe_torch_load
from agent.checkpoint.state import is_plain_tensor, map_tree
from spotrelay.errors import CorruptCheckpointError

FORMAT = "spotrelay-arena-1"
MARK = "__spotrelay_tensor__"
SUFFIX = ".tensors"


def sidecar(path: Path) -> Path:
    return path.with_name(path.name + SUFFIX)


def split(tree: Any, arena: Arena) -> tuple[dict[str, Any], list[tuple[int, int]]]:
    """The skeleton of a snapshot tree, and the arena segments of its tensors in file order."""
    specs: list[dict[str, Any]] = []
    segments: list[tuple[int, int]] = []
    pos = 0

    def leaf(obj: Any) -> Any:
        nonlocal pos
        where = arena.offset_of(obj) if isinstance(obj, torch.Tensor) and is_plain_tensor(obj) else None
        if where is None:  # not a tensor, empty, or not in the arena: stays in the skeleton
            return obj
        n = tensor_nbytes(obj)
        dtype = str(obj.dtype).removeprefix("torch.")
        specs.append({"offset": pos, "nbytes": n, "dtype": dtype, "shape": list(obj.shape)})
        add_segment(segments, where, n)
        pos += n
        return {MARK: len(specs) - 1}

    return {"format": FORMAT, "tree": map_tree(tree, leaf), "tensors": specs}, segments


def load_skeleton(path: Path | str) -> Any:
    """The state tree without reading the tensor bytes (tensors stay ``{MARK: i}``): for metadata."""
    loaded = safe_torch_load(path, map_location="cpu")
    return loaded["tree"] if isinstance(loaded, dict) and loaded.get("format") == FORMAT else loaded


def _read_raw(path: Path, total: int, lazy: bool) -> bytearray | mmap.mmap:
    if not total:  # a file whose tensors are all empty (ZeRO-3's module states on most ranks) has none
        return bytearray()
    with open(sidecar(path), "rb") as fh:
        if lazy:  # private, copy-on-write pages: read from disk (or the page cache) only when touched
            if os.fstat(fh.fileno()).st_size < total:
                raise CorruptCheckpointError(f"{sidecar(path)}: shorter than the {total} bytes {path.name} lists")
            return mmap.mmap(fh.fileno(), total, access=mmap.ACCESS_COPY)
        raw = bytearray(total)
        if fh.readinto(raw) != total:
            raise CorruptCheckpointError(f"{sidecar(path)}: shorter than the {total} bytes {path.name} lists")
        return raw


def _check_spec(spec: dict[str, Any], index: int, path: Path) -> torch.dtype:
    """One tensor record of a skeleton: its bytes lie in the raw file and make its shape."""
    dtype = getattr(torch, str(spec.get("dtype")), None)
    if not isinstance(dtype, torch.dtype):
        raise CorruptCheckpointError(f"{path}: unknown dtype {spec.get('dtype')!r}")
    offset, nbytes, shape = spec.get("offset"), spec.get("nbytes"), spec.get("shape")
    ints = [offset, nbytes, *(shape if isinstance(shape, list) else [None])]
    if not all(type(n) is int and 0 <= n < 1 << 62 for n in ints):
        raise CorruptCheckpointError(f"{path}: field tensors.{index} (offset, nbytes, shape) is not made of sizes")
    assert isinstance(shape, list) and isinstance(nbytes, int)
    numel = 1
    for n in shape:
        numel *= n
    if numel * torch.empty((), dtype=dtype).element_size() != nbytes:
        raise CorruptCheckpointError(f"{path}: field tensors.{index}: {nbytes} bytes do not make shape {shape}")
    return dtype


def load(path: Path | str, map_location: Any = None, lazy: bool = False) -> Any:
    """A file written as skeleton + tensors (or a plain torch file), tensors rebuilt on the CPU.
    ``lazy``: the tensors are views of the memory-mapped file, read only where they are used (a
    resharded resume reads just its slices of every saved partition)."""
    path = Path(path)
    loaded = safe_torch_load(path, map_location="cpu")
    if not (isinstance(loaded, dict) and loaded.get("format") == FORMAT):
        return loaded
    specs = loaded.get("tensors")
    if not isinstance(specs, list) or not all(isinstance(spec, dict) for spec in specs):
        raise CorruptCheckpointError(f"{path}: field tensors is not a list of tensor records")
    dtypes = [_check_spec(spec, i, path) for i, spec in enumerate(specs)]
    total = max((int(s["offset"]) + int(s["nbytes"]) for s in specs), default=0)
    raw = _read_raw(path, total, lazy)
    tensors = []
    for spec, dtype in zip(specs, dtypes, strict=True):
        count = int(spec["nbytes"]) // torch.empty((), dtype=dtype).element_size()
        flat = torch.frombuffer(raw, dtype=dtype, count=count, offset=int(spec["offset"])) if count else None
        tensors.append(flat.reshape(spec["shape"]) if flat is not None else torch.empty(spec["shape"], dtype=dtype))
    device = map_location if isinstance(map_location, str | torch.device) and str(map_location) != "cpu" else None

    def is_mark(obj: Any) -> bool:
        return isinstance(obj, dict) and set(obj) == {MARK}

    def leaf(obj: Any) -> Any:
        if not is_mark(obj):
            return obj
        if not (type(obj[MARK]) is int and 0 <= obj[MARK] < len(tensors)):
            raise CorruptCheckpointError(f"{path}: a tensor reference {str(obj[MARK])[:20]} outside its {len(tensors)}")
        found = tensors[obj[MARK]]
        return found.to(device) if device is not None else found

    return map_tree(loaded["tree"], leaf, stop=is_mark)
