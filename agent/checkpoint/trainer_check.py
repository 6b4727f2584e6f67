"""The trainer file's fields, checked before any of them is applied.

``trainer/rank-<R>.pt`` passed its sha256 against the manifest, so a bad value here was written
that way (by hand, by another tool, or by someone who rewrote the manifest too). Each problem is a
CorruptCheckpointError naming the file and the field, raised before the session's counters, data
position or RNGs change; a traceback from ``int()`` or ``random.setstate`` names neither.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from spotrelay.errors import CorruptCheckpointError

_MAX = 1 << 63  # int64, as torch and DeepSpeed count
_MT_WORDS = 624  # Mersenne Twister state (python and numpy)


def _bad(path: Path, field: str, value: Any, expected: str) -> CorruptCheckpointError:
    shown = type(value).__name__ if isinstance(value, dict | list | tuple | torch.Tensor) else repr(value)[:40]
    return CorruptCheckpointError(f"{path}: trainer state field {field} is {shown}, expected {expected}")


def _count(state: dict[str, Any], key: str, path: Path, least: int = 0, required: bool = True) -> None:
    if key not in state:
        if required:
            raise CorruptCheckpointError(f"{path}: trainer state has no field {key}")
        return
    value = state[key]
    if value is None and not required:
        return
    if type(value) is not int or not least <= value < _MAX:
        raise _bad(path, key, value, f"an integer >= {least}")


def _ints(values: Any, count: int) -> bool:
    return isinstance(values, list | tuple) and len(values) == count and all(type(v) is int for v in values)


def _rng(rng: Any, path: Path) -> None:
    if not isinstance(rng, dict):
        raise _bad(path, "rng", rng, "a dict")
    py, npst = rng.get("python"), rng.get("numpy")
    if not (isinstance(py, dict) and type(py.get("version")) is int and _ints(py.get("state"), _MT_WORDS + 1)
            and (py.get("gauss") is None or isinstance(py.get("gauss"), float))):  # fmt: skip
        raise _bad(path, "rng.python", py, "python's random.getstate()")
    npst = npst if isinstance(npst, dict) else {}
    keys, pos = npst.get("keys"), npst.get("pos")
    if not (isinstance(keys, torch.Tensor) and keys.dtype == torch.int64 and keys.numel() == _MT_WORDS
            and type(pos) is int and 0 <= pos <= _MT_WORDS
            and type(npst.get("has_gauss")) is int and isinstance(npst.get("cached"), float | int)):  # fmt: skip
        raise _bad(path, "rng.numpy", npst, "numpy's MT19937 state")
    cuda = rng.get("cuda")
    generators = [rng.get("torch"), *(cuda if isinstance(cuda, list) else [None])]
    if not all(isinstance(g, torch.Tensor) and g.dtype == torch.uint8 and g.dim() == 1 for g in generators):
        raise _bad(path, "rng.torch / rng.cuda", rng.get("torch"), "torch generator states (uint8 tensors)")


def check_trainer_state(state: Any, path: Path, stateful: Iterable[str] = ()) -> dict[str, Any]:
    """``state`` when every field the session reads has its type and range; else the first bad one."""
    if not isinstance(state, dict):
        raise _bad(path, "(the file)", state, "a dict")
    for key in ("step", "samples", "epoch"):
        _count(state, key, path)
    _count(state, "cursor", path, required=False)
    _count(state, "global_batch", path, least=1, required=False)
    for key in ("data", "scheduler"):
        if state.get(key) is not None and not isinstance(state[key], dict):
            raise _bad(path, key, state[key], "a dict or None")
    extra = state.get("extra")
    if not isinstance(extra, dict):
        raise _bad(path, "extra", extra, "a dict of the session's stateful objects")
    missing = sorted(set(stateful) - set(extra))
    if missing:
        raise CorruptCheckpointError(f"{path}: trainer state field extra has no {', '.join(missing)} (stateful)")
    handled = state.get("handled_requests")
    if not (isinstance(handled, list) and all(isinstance(r, str) for r in handled)):
        raise _bad(path, "handled_requests", handled, "a list of request ids")
    _rng(state.get("rng"), path)
    return state
