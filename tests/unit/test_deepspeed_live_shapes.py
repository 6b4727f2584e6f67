"""The live model's parameter list a DeepSpeed checkpoint's is checked against
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
