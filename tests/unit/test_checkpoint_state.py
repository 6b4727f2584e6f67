"""RNG and trainer state survive a save/load round trip exactly."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agent.checkpoint.arena import ArenaPool, arena_size
from agent.checkpoint.state import (
    capture_rng,
    load_trainer_state,
    restore_rng,
    save_trainer_state,
    snapshot_tree,
)


def _draws() -> tuple[float, float, list[float]]:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def test_rng_round_trip_through_a_file(tmp_path: Path) -> None:
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    np.random.standard_normal()  # leaves a cached gaussian in numpy's state
    path = tmp_path / "rank-0.pt"
    save_trainer_state(path, {"rng": capture_rng(), "step": 7, "samples": 0, "epoch": 0, "extra": {},
                              "handled_requests": []})  # fmt: skip
    expected = _draws()
    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)
    state = load_trainer_state(path)
    restore_rng(state["rng"])
    assert _draws() == expected
    assert state["step"] == 7


def test_snapshot_does_not_alias_live_tensors() -> None:
    live: dict[str, Any] = {"w": torch.zeros(4), "nested": [torch.ones(2)]}
    snap = snapshot_tree(live)
    live["w"].add_(1)
    live["nested"][0].add_(1)
    assert torch.equal(snap["w"], torch.zeros(4))
    assert torch.equal(snap["nested"][0], torch.ones(2))


def test_arena_memory_is_reused_once_released() -> None:
    pool = ArenaPool()
    live = {"w": torch.zeros(8)}
    arena = pool.acquire(arena_size(live))
    first = snapshot_tree(live, arena)
    live["w"].add_(2)
    assert torch.equal(first["w"], torch.zeros(8))  # still the old values: not aliased
    pool.release(arena)
    second = snapshot_tree(live, pool.acquire(arena_size(live)))
    assert second["w"].data_ptr() == first["w"].data_ptr()  # same memory, no new allocation
    assert torch.equal(second["w"], torch.full((8,), 2.0))
    pool.close()
