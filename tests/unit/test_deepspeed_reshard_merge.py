"""Merging ZeRO-1/2 partitions into whole tensors when the last rank's partition was padded.

DeepSpeed aligns a ZeRO-1/2 flat group to the world size: the last rank's partition has padding at
its end. It saves that rank's fp32 partition without the padding but its optimizer states (Adam's
moments) with it, so on 3 ranks (30,080 values in the tiny model: partitions 10,028, 10,028 and
10,024 + 4) the merge dropped the last rank's moments and a resume on 2 ranks failed with
"the partitions hold 568 values". Real DeepSpeed runs: tests/integration/test_checkpoint_resume_cross.py.
"""

from __future__ import annotations

from collections import namedtuple
from typing import Any

import pytest
import torch

from agent.checkpoint.deepspeed_reshard import FP32, _merge_zero12

Fragment = namedtuple("Fragment", "numel start")  # DeepSpeed's fragment_address has these fields
WHOLE = {"a": torch.arange(5.0), "b": torch.arange(10.0, 16.0).reshape(2, 3)}  # 11 values over 3 ranks


def _partition(values: torch.Tensor, mapping: dict[str, Fragment], padding: int) -> dict[str, Any]:
    """One rank's optimizer file: fp32 without the padding, Adam's moments with it."""
    padded = torch.cat([values, torch.zeros(padding)])
    return {
        "single_partition_of_fp32_groups": [values.clone()],
        "base_optimizer_state": {
            "state": {0: {"step": torch.tensor(3.0), "exp_avg": padded * 2, "exp_avg_sq": padded * 3}},
            "param_groups": [{"lr": 0.1, "params": [0]}],
        },
        "param_slice_mappings": [mapping],
        "group_paddings": [padding],
    }


def _partitions() -> list[dict[str, Any]]:
    flat = torch.cat([t.reshape(-1) for t in WHOLE.values()])  # a0..a4 b0..b5, partitions of 4, 4, 3 (+1)
    return [
        _partition(flat[0:4], {"a": Fragment(4, 0)}, 0),
        _partition(flat[4:8], {"a": Fragment(1, 0), "b": Fragment(3, 1)}, 0),
        _partition(flat[8:11], {"b": Fragment(3, 0)}, 1),
    ]


@pytest.mark.parametrize("name", ["a", "b"])
def test_every_state_of_a_parameter_in_the_padded_last_partition_is_merged_whole(name: str) -> None:
    full = _merge_zero12([{"a": (5,), "b": (2, 3)}], _partitions())
    want = WHOLE[name]
    views = full.tensors[name]
    assert set(views) == {FP32, "exp_avg", "exp_avg_sq"}
    assert torch.equal(views[FP32].whole(name, want.shape), want)
    assert torch.equal(views["exp_avg"].whole(name, want.shape), want * 2)
    assert torch.equal(views["exp_avg_sq"].whole(name, want.shape), want * 3)
    assert float(full.scalars["step"]) == 3.0
