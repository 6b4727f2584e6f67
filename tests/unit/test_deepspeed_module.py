"""agent.checkpoint.deepspeed_module: a resize's frozen parameters and buffers must be the live module's."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from agent.checkpoint.deepspeed_module import check, merge, persistent_buffers, scatter
from spotrelay.errors import IncompatibleCheckpointError


class Net(nn.Module):
    def __init__(self, width: int = 3) -> None:
        super().__init__()
        self.base = nn.Linear(2, width)
        self.head = nn.Linear(width, 1)
        self.base.requires_grad_(False)
        self.register_buffer("count", torch.zeros(()))
        self.register_buffer("scratch", torch.zeros(2), persistent=False)  # not in a state dict: not restored


def _saved(net: nn.Module) -> dict[str, object]:
    return {"module": {k: v.clone() for k, v in net.state_dict().items()}, "buffer_names": ["count"]}


def test_frozen_weights_and_persistent_buffers_are_copied_into_the_live_module() -> None:
    saved_net = Net()
    saved_net.base.weight.data.fill_(7.0)
    saved_net.count.fill_(42)
    saved = merge(Path("/c"), 2, 2, _saved(saved_net), trainable={"head.weight", "head.bias"})
    assert sorted(saved.frozen) == ["base.bias", "base.weight"] and list(saved.buffers) == ["count"]
    live = Net()
    scatter(SimpleNamespace(module=live), saved)
    assert torch.equal(live.base.weight, saved_net.base.weight) and float(live.count) == 42
    assert not torch.equal(live.head.weight, saved_net.head.weight)  # the optimizer's, not this module's


def test_a_module_unlike_the_saved_one_is_refused_naming_what_differs() -> None:
    saved = merge(Path("/c"), 1, 1, _saved(Net()), trainable={"head.weight", "head.bias"})
    net = Net(width=4)
    with pytest.raises(IncompatibleCheckpointError, match=r"base\.weight: shape \(3, 2\) in the checkpoint"):
        check(saved, SimpleNamespace(module=net))
    net = Net()
    net.head.requires_grad_(False)  # frozen here, trained when saved
    with pytest.raises(IncompatibleCheckpointError, match=r"frozen parameter head\.bias is not in the checkpoint"):
        check(saved, SimpleNamespace(module=net))
    net = Net()
    del net._buffers["count"]
    with pytest.raises(IncompatibleCheckpointError, match="the checkpoint's buffer count is not in this model"):
        check(saved, SimpleNamespace(module=net))


class SharedBlock(nn.Module):
    """One block (weights and running statistics) under two parents, as an encoder and a decoder sharing it."""

    def __init__(self) -> None:
        super().__init__()
        block = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
        self.enc, self.dec = nn.Sequential(block), nn.Sequential(block)


def test_a_submodule_under_two_parents_has_its_buffers_under_both_names() -> None:
    """DeepSpeed's ``buffer_names`` (``_get_buffer_names``: each parent names its children) and the state
    dict list the shared block's statistics under ``enc`` and ``dec``; ``named_modules`` names them once,
    so such a checkpoint was refused at another size ("the checkpoint's buffer dec.0.1.running_mean is
    not in this model"), and a stage-0 one even at the same size (the second names counted as parameters)."""
    saved_net = SharedBlock()
    saved_net.enc[0][1].running_mean.fill_(3.0)
    stats = ("running_mean", "running_var", "num_batches_tracked")
    names = [f"{parent}.0.1.{s}" for parent in ("enc", "dec") for s in stats]
    assert [n for n, _ in persistent_buffers(saved_net)] == names
    states = {"module": {k: v.clone() for k, v in saved_net.state_dict().items()}, "buffer_names": names}
    saved = merge(Path("/c"), 1, 2, states, trainable={n for n, _ in saved_net.named_parameters()})
    live = SharedBlock()
    scatter(SimpleNamespace(module=live), saved)
    assert torch.equal(live.dec[0][1].running_mean, torch.full((2,), 3.0))
