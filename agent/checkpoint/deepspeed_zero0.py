"""DeepSpeed without ZeRO (stage 0) on either side of a resize or a stage change.

Stage 0 keeps no partitions: every rank holds the whole module and a plain torch optimizer, and
DeepSpeed saves them in ``mp_rank_00_model_states.pt`` (``module``, and ``optimizer`` as the torch
optimizer's state dict, indexed by parameter position) with no ``param_shapes`` and no
``zero_pp_rank_*`` files. *Merge* describes them as the same whole per-parameter tensors a ZeRO
merge gives (agent.checkpoint.deepspeed_reshard.FullState); *scatter* copies them into a live
stage-0 engine's parameters and optimizer state. The saved optimizer's positions are the trainable
parameters in module order (``model.parameters()``, what ``deepspeed.initialize`` is given).
Frozen parameters and buffers come whole from ``module`` (agent.checkpoint.deepspeed_module).
Mixed-precision wrappers (an fp16/bf16 optimizer holding its own master weights) are refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from agent.checkpoint import deepspeed_module
from agent.checkpoint.deepspeed_reshard import FP32, FullState, add_views
from agent.checkpoint.flat_view import FlatView
from spotrelay.errors import IncompatibleCheckpointError

SAME_SHAPE = "resume it on the world size and ZeRO stage that wrote it"


def saved_shapes(model_states: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """The saved parameters' shapes: the module's tensors that are not buffers."""
    buffers = set(model_states.get("buffer_names") or [])
    module = model_states.get("module") or {}
    return {k: tuple(v.shape) for k, v in module.items() if isinstance(v, torch.Tensor) and k not in buffers}


def _plain(state: Any) -> bool:
    return isinstance(state, dict) and set(state) == {"state", "param_groups"}


def merge(step_dir: Path, model_states: dict[str, Any], trainable: list[str]) -> FullState:
    """``trainable``: the live model's trainable parameter names in module order."""
    osd: Any = model_states.get("optimizer")
    module = model_states["module"]
    if not _plain(osd):
        raise IncompatibleCheckpointError(
            f"{step_dir}: a ZeRO stage 0 checkpoint whose optimizer is not a plain torch optimizer (fp16/bf16 "
            f"master weights); {SAME_SHAPE}"
        )
    positions = [i for group in osd["param_groups"] for i in group["params"]]
    if len(positions) != len(trainable) or not set(trainable) <= set(saved_shapes(model_states)):
        raise IncompatibleCheckpointError(
            f"{step_dir}: its optimizer steps {len(positions)} parameters, this model trains {len(trainable)} "
            f"(another set of frozen parameters); {SAME_SHAPE}"
        )
    full = FullState(param_groups=osd["param_groups"])
    full.module = deepspeed_module.merge(step_dir, 0, 1, model_states, set(trainable))
    for position, name in zip(positions, trainable, strict=True):
        weight = module[name]
        views = {FP32: FlatView([weight.reshape(-1)])}
        for key, value in osd["state"].get(position, {}).items():
            if isinstance(value, torch.Tensor) and value.dim() == 0:
                full.scalars[key] = value
            elif isinstance(value, torch.Tensor) and value.numel() == weight.numel():
                views[key] = FlatView([value.reshape(-1)])
        add_views(full, name, tuple(weight.shape), views)
    return full


def scatter(engine: Any, full: FullState) -> None:
    """Whole tensors into a live stage-0 engine: its parameters, its torch optimizer's state."""
    opt = engine.optimizer
    if not isinstance(opt, torch.optim.Optimizer):
        raise IncompatibleCheckpointError(
            f"this DeepSpeed engine (ZeRO stage 0) steps a {type(opt).__name__}, not a plain torch optimizer; "
            f"{SAME_SHAPE}"
        )
    names = {id(p): n for n, p in engine.module.named_parameters()}
    keys = {k for per in full.tensors.values() for k in per if k != FP32}
    for group, saved in zip(opt.param_groups, full.param_groups, strict=False):
        group.update({k: v for k, v in saved.items() if k != "params"})  # lr, betas, ... as saved
    for group in opt.param_groups:
        for param in group["params"]:
            name = names[id(param)]
            if name not in full.tensors and not param.numel():  # no values: ZeRO saves it with no state
                continue
            saved, shape = full.tensors[name], full.shapes[name]
            with torch.no_grad():
                param.data.copy_(saved[FP32].whole(name, shape).to(param.dtype))
            state = opt.state[param]
            for key in keys:
                state[key] = saved[key].whole(name, shape).to(param.device)
            for key, value in full.scalars.items():
                state[key] = value.clone()
    deepspeed_module.scatter(engine, full.module)
