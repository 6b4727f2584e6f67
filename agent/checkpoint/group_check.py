"""The optimizer's saved hyper-parameters, checked against this run's before they are applied.

A param group's values (``lr``, ``betas``, ``weight_decay``, ...) are plain values inside the
engine's files: the pickle scan lets a string or a list through, and torch's ``load_state_dict``
copies them without a look, so a saved ``lr: "0.1"`` used to surface as a TypeError traceback at
the first optimizer step, retried on every attempt. Each must have the kind of value this run's
optimizer holds for the same key (a number, a tuple of numbers of the same length, a flag, ...):
anything else is a CorruptCheckpointError naming the checkpoint and the field.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from spotrelay.errors import CorruptCheckpointError

SKIPPED = frozenset({"params", "param_names"})  # the parameters themselves: the engines map them


def _number(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.numel() == 1 and bool(torch.isfinite(value).all())
    return type(value) in (int, float) and math.isfinite(value)


def _fits(saved: Any, live: Any) -> bool:
    """``saved`` is the kind of value ``live`` is (None in this run accepts None, a flag or a number)."""
    if live is None:
        return saved is None or type(saved) is bool or _number(saved)
    if type(live) is bool:
        return type(saved) is bool
    if _number(live) or isinstance(live, torch.Tensor):
        return _number(saved)
    if isinstance(live, tuple | list):
        return isinstance(saved, tuple | list) and len(saved) == len(live) and all(map(_fits, saved, live))
    if isinstance(live, str):
        return isinstance(saved, str)
    return True  # a kind this check does not know: the optimizer's own load decides


def _shown(value: Any) -> str:
    if isinstance(value, dict | torch.Tensor):
        return type(value).__name__
    return repr(value)[:40]


def check_param_groups(where: Path, saved: Any, live: list[dict[str, Any]], same_count: bool = True) -> None:
    """Every saved param group's hyper-parameters fit this optimizer's ``live`` groups (pairwise;
    ``same_count``: as many groups as this optimizer has)."""
    if not isinstance(saved, list | tuple) or not all(isinstance(group, dict) for group in saved):
        raise CorruptCheckpointError(
            f"{where}: optimizer field param_groups is {_shown(saved)}, expected a list of dicts"
        )
    if same_count and len(saved) != len(live):
        raise CorruptCheckpointError(
            f"{where}: optimizer field param_groups holds {len(saved)} groups, this optimizer has {len(live)}"
        )
    for index, (group, own) in enumerate(zip(saved, live, strict=False)):
        for key, value in own.items():
            if key in SKIPPED or key not in group:
                continue  # a missing key is another optimizer: compat.check_optimizer_names says so
            if not _fits(group[key], value):
                raise CorruptCheckpointError(
                    f"{where}: optimizer field param_groups.{index}.{key} is {_shown(group[key])}, "
                    f"expected a value like this run's {_shown(value)}"
                )
