"""agent.checkpoint.deepspeed_module: a resize's frozen parameters and buffers must be the live module's."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from agent.checkpoint.deepspeed_module import check, merge, scatter
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
