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

from pathlib import Path
from typing import Any

import torch

from agent.checkpoint.arena import Arena, tensor_nbytes
from agent.checkpoint.safety import safe_torch_load
from agent.checkpoint.state import is_plain_tensor
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

    def walk(obj: Any) -> Any:
        nonlocal pos
        if isinstance(obj, torch.Tensor) and is_plain_tensor(obj):
            where = arena.offset_of(obj)
            if where is None:  # empty, or not copied into the arena: stays in the skeleton
                return obj
            n = tensor_nbytes(obj)
            dtype = str(obj.dtype).removeprefix("torch.")
            specs.append({"offset": pos, "nbytes": n, "dtype": dtype, "shape": list(obj.shape)})
            if segments and sum(segments[-1]) == where:
                segments[-1] = (segments[-1][0], segments[-1][1] + n)
            else:
                segments.append((where, n))
            pos += n
            return {MARK: len(specs) - 1}
        if isinstance(obj, dict):
            items = [(k, walk(v)) for k, v in obj.items()]
            return dict(items) if type(obj) is dict else type(obj)(items)
        if isinstance(obj, list):
            return [walk(v) for v in obj]
        if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
            return tuple(walk(v) for v in obj)
        return obj

    tree = walk(tree)
    return {"format": FORMAT, "tree": tree, "tensors": specs}, segments


def load(path: Path | str, map_location: Any = None) -> Any:
    """A file written as skeleton + tensors (or a plain torch file), tensors rebuilt on the CPU."""
    path = Path(path)
    loaded = safe_torch_load(path, map_location="cpu")
    if not (isinstance(loaded, dict) and loaded.get("format") == FORMAT):
        return loaded
    specs: list[dict[str, Any]] = loaded["tensors"]
    total = sum(int(s["nbytes"]) for s in specs)
    raw = bytearray(total)
    if total:  # a file whose tensors are all empty (ZeRO-3's module states on most ranks) has none
        with open(sidecar(path), "rb") as fh:
            if fh.readinto(raw) != total:
                raise CorruptCheckpointError(f"{sidecar(path)}: shorter than the {total} bytes {path.name} lists")
    tensors = []
    for spec in specs:
        dtype = getattr(torch, str(spec["dtype"]), None)
        if not isinstance(dtype, torch.dtype):
            raise CorruptCheckpointError(f"{path}: unknown dtype {spec['dtype']!r}")
        count = int(spec["nbytes"]) // torch.empty((), dtype=dtype).element_size()
        flat = torch.frombuffer(raw, dtype=dtype, count=count, offset=int(spec["offset"]))
        tensors.append(flat.reshape(spec["shape"]))
    device = map_location if isinstance(map_location, str | torch.device) else None
    return _join(loaded["tree"], tensors, device)


def _join(obj: Any, tensors: list[torch.Tensor], device: Any) -> Any:
    if isinstance(obj, dict):
        if set(obj) == {MARK}:
            found = tensors[int(obj[MARK])]
            return found.to(device) if device is not None and str(device) != "cpu" else found
        items = [(k, _join(v, tensors, device)) for k, v in obj.items()]
        return dict(items) if type(obj) is dict else type(obj)(items)
    if isinstance(obj, list):
        return [_join(v, tensors, device) for v in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_join(v, tensors, device) for v in obj)
    return obj
