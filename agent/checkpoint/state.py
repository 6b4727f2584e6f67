"""The per-rank trainer state that is not model or optimizer: RNGs, counters, data position.

Saved as one torch file per rank (``trainer/rank-<R>.pt``) holding only tensors, numbers,
strings and containers, so it loads with ``weights_only=True``.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from agent.checkpoint.safety import safe_torch_load
from spotrelay.errors import CorruptCheckpointError

TRAINER_DIR = "trainer"


def trainer_file(step_dir: Path, rank: int) -> Path:
    return step_dir / TRAINER_DIR / f"rank-{rank}.pt"


def capture_rng() -> dict[str, Any]:
    """Python, numpy, torch and (when present) CUDA generator states, in loadable types."""
    version, internal, gauss = random.getstate()
    _kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    return {
        "python": {"version": version, "state": list(internal), "gauss": gauss},
        "numpy": {
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64).copy()),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached": float(cached),
        },
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def restore_rng(state: dict[str, Any]) -> None:
    py = state["python"]
    random.setstate((py["version"], tuple(py["state"]), py["gauss"]))
    npst = state["numpy"]
    keys = npst["keys"].numpy().astype(np.uint32)
    np.random.set_state(("MT19937", keys, npst["pos"], npst["has_gauss"], npst["cached"]))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():  # a node with fewer devices restores the ones it has
        for device, cuda_state in enumerate(state["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(cuda_state, device)


class Buffers(Protocol):
    """Where snapshot copies go: a shared-memory Arena (agent.checkpoint.arena)."""

    def take(self, like: torch.Tensor) -> torch.Tensor: ...


def _copy_dtensor(obj: Any, pool: Buffers) -> Any:
    """An FSDP/TP shard: copy its local tensor into the pool, keep its mesh and placements."""
    from torch.distributed.tensor import DTensor

    local = obj.to_local().detach()
    buf = pool.take(local)
    buf.copy_(local)
    return DTensor.from_local(
        buf, obj.device_mesh, obj.placements, run_check=False, shape=obj.shape, stride=obj.stride()
    )


def is_plain_tensor(obj: Any) -> bool:
    """A tensor that owns ordinary memory (not a DTensor, ShardedTensor or other subclass)."""
    return type(obj) in (torch.Tensor, torch.nn.Parameter)


def is_dtensor(obj: Any) -> bool:
    return type(obj).__name__ == "DTensor" and type(obj).__module__.startswith("torch.distributed")


def map_tree(obj: Any, leaf: Callable[[Any], Any], stop: Callable[[Any], bool] = lambda _: False) -> Any:
    """Rebuild dicts (keeping their type), lists and plain tuples around ``leaf`` of everything
    else; ``stop`` marks containers that are leaves too."""
    if stop(obj):
        return leaf(obj)
    if isinstance(obj, dict):
        items = [(k, map_tree(v, leaf, stop)) for k, v in obj.items()]
        return dict(items) if type(obj) is dict else type(obj)(items)
    if isinstance(obj, list):
        return [map_tree(v, leaf, stop) for v in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(map_tree(v, leaf, stop) for v in obj)
    return leaf(obj)


def snapshot_tree(obj: Any, pool: Buffers | None = None) -> Any:
    """A copy of a state tree whose tensors no longer alias live training memory (one memcpy);
    with a pool, plain tensors and DTensor shards are copied into it."""

    def leaf(obj: Any) -> Any:
        if not isinstance(obj, torch.Tensor):
            return copy.deepcopy(obj)
        if pool is not None and is_dtensor(obj) and obj.device.type == "cpu":
            return _copy_dtensor(obj, pool)
        if pool is None or not is_plain_tensor(obj):  # anything else: plain copy
            return obj.detach().to("cpu", copy=True)
        buf = pool.take(obj)
        buf.copy_(obj.detach())
        return buf

    return map_tree(obj, leaf)


def save_trainer_state(path: Path, state: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, path)


def load_trainer_state(path: Path, stateful: Iterable[str] = ()) -> dict[str, Any]:
    """Loaded without running code, every field the session reads checked (CorruptCheckpointError
    naming the file and field); ``stateful``: the names of the session's stateful objects."""
    from agent.checkpoint.trainer_check import check_trainer_state

    try:
        loaded = safe_torch_load(path, map_location="cpu")
    except FileNotFoundError as exc:
        raise CorruptCheckpointError(f"{path}: the trainer file is missing") from exc
    except (RuntimeError, EOFError, ValueError) as exc:  # torch's "not a zip archive", a truncated file
        raise CorruptCheckpointError(f"{path}: not a trainer file ({str(exc).splitlines()[0][:100]})") from exc
    return check_trainer_state(loaded, path, stateful)
