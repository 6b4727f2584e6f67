"""DeepSpeed stage 0 (no ZeRO) described as whole tensors for a resize or a stage change, and what
is refused (agent/checkpoint/deepspeed_zero0.py; real runs: tests/integration/test_checkpoint_resume_cross.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from agent.checkpoint.deepspeed_reshard import FP32, FullState, add_views
from agent.checkpoint.deepspeed_zero0 import merge, saved_shapes, scatter
from agent.checkpoint.flat_view import FlatView
from spotrelay.errors import IncompatibleCheckpointError

STEP = Path("/c/step-00000003")


def _model_states(optimizer: Any = None) -> dict[str, Any]:
    module = {"a": torch.arange(6.0).reshape(2, 3), "b": torch.arange(2.0), "running": torch.zeros(4)}
    adam = {
        "state": {0: {"step": torch.tensor(3.0), "exp_avg": module["a"] * 2}, 1: {"step": torch.tensor(3.0),
                                                                                 "exp_avg": module["b"] * 2}},
        "param_groups": [{"lr": 0.1, "params": [0, 1]}],
    }  # fmt: skip
    return {"module": module, "buffer_names": ["running"], "optimizer": adam if optimizer is None else optimizer,
            "param_shapes": None}  # fmt: skip


def test_the_module_and_its_torch_optimizer_become_whole_tensors_by_name() -> None:
    states = _model_states()
    assert saved_shapes(states) == {"a": (2, 3), "b": (2,)}  # buffers are not parameters
    full = merge(STEP, states, ["a", "b"])
    assert torch.equal(full.tensors["a"][FP32].whole("a", (2, 3)), states["module"]["a"])
    assert torch.equal(full.tensors["b"]["exp_avg"].whole("b", (2,)), states["module"]["b"] * 2)
    assert float(full.scalars["step"]) == 3.0 and full.param_groups[0]["lr"] == 0.1


def test_frozen_parameters_and_buffers_come_whole_from_the_module() -> None:
    states = _model_states()
    states["optimizer"]["param_groups"][0]["params"] = [0]  # "b" was frozen: the optimizer stepped "a" only
    full = merge(STEP, states, ["a"])
    assert set(full.tensors) == {"a"} and set(full.module.frozen) == {"b"} and set(full.module.buffers) == {"running"}
    assert torch.equal(full.module.frozen["b"].whole("b", full.module.shapes["b"]), states["module"]["b"])


def test_another_set_of_frozen_parameters_and_mixed_precision_optimizers_are_refused_naming_the_checkpoint() -> None:
    with pytest.raises(IncompatibleCheckpointError, match=r"^/c/step-00000003: its optimizer steps 2 parameters, "
                                                          r"this model trains 1"):
        merge(STEP, _model_states(), ["a"])  # "b" was trained, and is frozen now
    fp16 = {"optimizer_state_dict": {}, "fp32_groups_flat": []}
    with pytest.raises(IncompatibleCheckpointError, match=r"^/c/step-00000003: a ZeRO stage 0 checkpoint whose"):
        merge(STEP, _model_states(fp16), ["a", "b"])


def test_a_zero_checkpoint_scatters_into_stage_0_whose_optimizer_holds_a_parameter_of_no_values() -> None:
    """ZeRO saves no state for a trainable parameter of no values (not its optimizer's); the stage-0
    optimizer holds it (it steps every trainable parameter): it is left as it is, not a KeyError."""
    net = torch.nn.Module()
    net.a, net.extra = torch.nn.Parameter(torch.zeros(2, 3)), torch.nn.Parameter(torch.empty(0))
    full = FullState(param_groups=[{"lr": 0.1, "params": [0]}])
    add_views(full, "a", (2, 3), {FP32: FlatView([torch.arange(6.0)]), "exp_avg": FlatView([torch.ones(6)])})
    engine = SimpleNamespace(module=net, optimizer=torch.optim.AdamW(list(net.parameters())))
    scatter(engine, full)
    assert torch.equal(net.a.detach(), torch.arange(6.0).reshape(2, 3))
    assert torch.equal(engine.optimizer.state[net.a]["exp_avg"], torch.ones(2, 3))
