"""The live model's parameter list a DeepSpeed checkpoint's list is checked against
(agent.checkpoint.deepspeed_engine.DeepSpeedEngine.live_shapes): what the saving engine lists, on each
side of a resume. Real engines: tests/integration/test_checkpoint_resume_frozen.py."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn

from agent.checkpoint.deepspeed_engine import DeepSpeedEngine


class WithEmpty(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 2)
        self.extra = nn.Parameter(torch.empty(0))  # trainable, no values


def test_a_trainable_parameter_of_no_values_is_not_the_zero_optimizers() -> None:
    """ZeRO-1/2/3 leave it out of their partitions and their saved ``param_shapes`` (DeepSpeed's
    is_optimized_parameter): listed here, every checkpoint of such a model was refused as another model
    ("the checkpoint has no extra"), even at the same size."""
    shapes = DeepSpeedEngine(SimpleNamespace(module=WithEmpty())).live_shapes()
    assert shapes == {"lin.weight": (2, 4), "lin.bias": (2,)}


def test_stage_0s_list_names_a_zero3_parameter_with_its_whole_shape() -> None:
    """A stage-0 checkpoint resumed on ZeRO-3: its list (every tensor of the module) was compared with the
    live state dict's placeholders, so every such resume was refused ("lin.weight saved (2, 4), now (0,)")."""
    net = WithEmpty()
    for param in net.parameters():  # as ZeRO-3 partitions them: no values here, the shape in ds_shape
        param.ds_shape, param.data = param.shape, torch.empty(0)
    shapes = DeepSpeedEngine(SimpleNamespace(module=net)).live_shapes(trainable_only=False)
    assert shapes == {"lin.weight": (2, 4), "lin.bias": (2,), "extra": (0,)}
