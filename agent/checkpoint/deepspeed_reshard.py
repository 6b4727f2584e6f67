"""DeepSpeed ZeRO-1/2/3 resumed at another data-parallel size, from our own checkpoint files.

DeepSpeed's ``load_checkpoint`` only reads partitions for the world that wrote them. At another
size we convert at restore time, in two steps, without DeepSpeed's pickle loader:

1. **Merge**: every saved optimizer partition (each rank's file, memory-mapped through our
   skeleton + raw tensor format, not read yet) is described as whole per-parameter tensors: the
   fp32 master weights and each optimizer state of the same size (Adam's ``exp_avg``,
   ``exp_avg_sq``), each a :class:`FlatView` of fragments. ZeRO-1/2 files say where each
   parameter's fragment lies (``param_slice_mappings``: start and length in that rank's flat
   partition; a parameter's fragments in rank order make the whole). ZeRO-3 splits every
   parameter in ``ceil(numel / world)`` pieces, in ``param_shapes`` order.
2. **Scatter**: the live engine, built for the new world, copies its own slice of each tensor
   straight from the mapped files: the fp32 partition, the optimizer states, the model weights
   (ZeRO-1/2: every rank holds them whole; ZeRO-3: this rank's partition), the step count, the
   optimizer's hyper-parameters, the LR scheduler and DeepSpeed's step/sample counters. Nothing is
   consolidated: a rank reads about its share of the checkpoint, as a same-size resume does.

Frozen parameters and persistent buffers are not in the optimizer's partitions: they come whole from
the model-states files (agent.checkpoint.deepspeed_module). Tensor/pipeline parallelism is refused
(only the data-parallel size may change).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from agent.checkpoint import arena_files, deepspeed_module
from agent.checkpoint.deepspeed_module import ModuleTensors
from agent.checkpoint.flat_view import FlatView, joined
from spotrelay.errors import CorruptCheckpointError, IncompatibleCheckpointError

FP32 = "__fp32__"


def model_states_file(step_dir: Path, stage: int) -> Path:
    return deepspeed_module.zero3_states_file(step_dir, 0) if stage == 3 else step_dir / "mp_rank_00_model_states.pt"


def optim_file(step_dir: Path, rank: int) -> Path:
    for prefix in ("", "bf16_"):
        path = step_dir / f"{prefix}zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"
        if path.is_file():
            return path
    raise CorruptCheckpointError(f"{step_dir}: no optimizer partition of rank {rank}")


def base_optimizer_state(optimizer_state: dict[str, Any], stage: int) -> dict[str, Any] | None:
    """The torch optimizer's own state dict inside a ZeRO optimizer's (None: a layout we do not know)."""
    found = optimizer_state.get("optimizer_state_dict" if stage == 3 else "base_optimizer_state")
    return found if isinstance(found, dict) and "param_groups" in found else None


def saved_shapes(model_states: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """The saved trainable parameters' shapes (stage 0 records none: its module's, frozen ones too)."""
    if model_states.get("param_shapes") is None:
        from agent.checkpoint import deepspeed_zero0

        return deepspeed_zero0.saved_shapes(model_states)
    return {name: tuple(shape) for group in model_states["param_shapes"] for name, shape in group.items()}


@dataclass
class FullState:
    """Whole per-parameter tensors, as views: ``tensors[name][FP32]`` and ``tensors[name][state key]``."""

    tensors: dict[str, dict[str, FlatView]] = field(default_factory=dict)
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    scalars: dict[str, torch.Tensor] = field(default_factory=dict)  # the optimizer's 0-d state (step)
    param_groups: list[dict[str, Any]] = field(default_factory=list)
    module: ModuleTensors = field(default_factory=ModuleTensors)  # frozen parameters and buffers, whole


def _flat_states(
    state: Any, index: int, numel: int, padding: int = 0
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(states as large as the flat partition, 0-d states) of one flat parameter's optimizer entry.

    ZeRO-1/2 saves the last rank's fp32 partition without its alignment padding but the optimizer
    states with it (``numel + padding`` values): the padding, at the end, is cut off."""
    entry = state[index]
    flat = {
        k: v.narrow(0, 0, numel)
        for k, v in entry.items()
        if isinstance(v, torch.Tensor) and v.dim() == 1 and v.numel() in (numel, numel + padding)
    }
    scalars = {k: v for k, v in entry.items() if isinstance(v, torch.Tensor) and v.dim() == 0}
    return flat, scalars


def merge(step_dir: Path, stage: int, world: int, model_states: dict[str, Any], trainable: list[str]) -> FullState:
    """``model_states``: the (rank 0) model-states file, loaded with its tensors mapped (the frozen
    parameters and buffers are read from it); ``trainable``: the live model's trainable parameter names
    in module order (stage 0's optimizer positions)."""
    if stage == 0:
        from agent.checkpoint import deepspeed_zero0

        return deepspeed_zero0.merge(step_dir, model_states, trainable)
    optims = [arena_files.load(optim_file(step_dir, r), lazy=True)["optimizer_state_dict"] for r in range(world)]
    groups: list[dict[str, Any]] = model_states["param_shapes"]
    try:
        full = _merge_zero3(groups, optims, world) if stage == 3 else _merge_zero12(groups, optims)
    except CorruptCheckpointError as exc:  # name the checkpoint, not only the parameter
        raise CorruptCheckpointError(f"{step_dir}: {exc}") from exc
    try:
        full.module = deepspeed_module.merge(step_dir, stage, world, model_states, set(saved_shapes(model_states)))
    except IncompatibleCheckpointError as exc:
        raise IncompatibleCheckpointError(f"{step_dir}: {exc}") from exc
    return full


def _merge_zero12(groups: list[dict[str, Any]], optims: list[dict[str, Any]]) -> FullState:
    full = FullState(param_groups=optims[0]["base_optimizer_state"]["param_groups"])
    for g, shapes in enumerate(groups):
        per_rank = []
        for osd in optims:
            flat = osd["single_partition_of_fp32_groups"][g]
            padding = int((osd.get("group_paddings") or [0] * len(groups))[g])
            states, scalars = _flat_states(osd["base_optimizer_state"]["state"], g, flat.numel(), padding)
            full.scalars.update(scalars)
            per_rank.append(({FP32: flat, **states}, osd["param_slice_mappings"][g]))
        for name, shape in shapes.items():
            pieces: dict[str, list[torch.Tensor]] = {}
            for flats, mapping in per_rank:
                frag = mapping.get(name)
                if frag is None:
                    continue
                for key, flat in flats.items():
                    pieces.setdefault(key, []).append(flat.narrow(0, frag.start, frag.numel))
            add_views(full, name, tuple(shape), {key: FlatView(p) for key, p in pieces.items()})
    return full


def _merge_zero3(groups: list[dict[str, Any]], optims: list[dict[str, Any]], world: int) -> FullState:
    full = FullState(param_groups=optims[0]["optimizer_state_dict"]["param_groups"])
    per_rank: list[dict[str, FlatView]] = []
    for osd in optims:
        subgroups = list(osd["fp32_flat_groups"])
        flats: dict[str, list[torch.Tensor]] = {FP32: subgroups}
        for i, sub in enumerate(subgroups):
            states, scalars = _flat_states(osd["optimizer_state_dict"]["state"], i, sub.numel())
            full.scalars.update(scalars)
            for key, value in states.items():
                flats.setdefault(key, []).append(value)
        per_rank.append({key: FlatView(parts) for key, parts in flats.items()})
    offset = 0
    for shapes in groups:
        for name, shape in shapes.items():
            numel = math.prod(shape)
            part = math.ceil(numel / world)
            views = {key: joined([r[key].slice(offset, part) for r in per_rank]).slice(0, numel) for key in per_rank[0]}
            add_views(full, name, tuple(shape), views)
            offset += part
    return full


def add_views(full: FullState, name: str, shape: tuple[int, ...], views: dict[str, FlatView]) -> None:
    for view in views.values():
        if view.numel != math.prod(shape):
            raise CorruptCheckpointError(f"{name}: the partitions hold {view.numel} values, the shape {shape}")
    full.tensors[name], full.shapes[name] = views, shape


# --- scatter into the live engine ----------------------------------------------------------------
def _ensure_state(base: torch.optim.Optimizer, flats: list[torch.Tensor], full: FullState, keys: set[str]) -> None:
    """Adam-like optimizers create their state on the first step: create it now, then overwrite."""
    for group, saved in zip(base.param_groups, full.param_groups, strict=False):
        group.update({k: v for k, v in saved.items() if k != "params"})  # lr, betas, ... as saved
    for flat in flats:  # the fp32 partitions the base optimizer steps (ZeRO-3 swaps them into its groups)
        state = base.state[flat]
        for key in keys:
            if key not in state or state[key].shape != flat.shape:
                state[key] = torch.zeros_like(flat)
        for key, value in full.scalars.items():
            state[key] = value.clone()


def scatter(engine: Any, full: FullState) -> None:
    opt = engine.optimizer
    keys = {k for per in full.tensors.values() for k in per if k != FP32}
    names = {id(p): n for n, p in engine.module.named_parameters()}
    if engine.zero_optimization_stage() == 0:
        from agent.checkpoint import deepspeed_zero0

        deepspeed_zero0.scatter(engine, full)
    elif engine.zero_optimization_stage() == 3:
        _ensure_state(opt.optimizer, list(opt.fp32_partitioned_groups_flat), full, keys)
        _scatter_zero3(engine, opt, names, full, keys)
    else:
        _ensure_state(opt.optimizer, list(opt.single_partition_of_fp32_groups), full, keys)
        _scatter_zero12(opt, names, full, keys)
    deepspeed_module.scatter(engine, full.module)


def _scatter_zero12(opt: Any, names: dict[int, str], full: FullState, keys: set[str]) -> None:
    for i, group in enumerate(opt.bit16_groups):
        flat_hp = opt.single_partition_of_fp32_groups[i]
        state = opt.optimizer.state[flat_hp]
        for lp in group:
            name = names[id(lp)]
            saved = full.tensors[name]
            with torch.no_grad():  # every ZeRO-1/2 rank holds the whole weights
                lp.data.copy_(saved[FP32].whole(name, full.shapes[name]).to(lp.dtype))
            mapping = lp._hp_mapping
            if mapping is None:  # no fragment of this parameter in this rank's partition
                continue
            src, dst = mapping.lp_fragment_address, mapping.hp_fragment_address
            for key in (FP32, *keys):
                target = flat_hp if key == FP32 else state[key]
                saved[key].copy_into(src.start, target.data.narrow(0, dst.start, dst.numel))


def _scatter_zero3(engine: Any, opt: Any, names: dict[int, str], full: FullState, keys: set[str]) -> None:
    import torch.distributed as dist

    rank = dist.get_rank(group=opt.dp_process_group)
    for param in engine.module.parameters():
        if not param.requires_grad:  # frozen: not the optimizer's (deepspeed_module.scatter)
            continue
        name = names[id(param)]
        saved = full.tensors[name]
        part = int(param.ds_tensor.ds_numel)
        for key in (FP32, *keys):
            mine = deepspeed_module.rank_piece(saved[key], part, rank)
            target, _ = opt._get_fp32_opt_state_partition(param, False, None if key == FP32 else key)
            target.data.copy_(mine[: target.numel()])
            if key == FP32:
                deepspeed_module.set_zero3_param(param, mine, saved[key])


def restore_counters(engine: Any, model_states: dict[str, Any]) -> None:
    """What DeepSpeed's own load sets besides the tensors: scheduler, step and sample counters."""
    if engine.lr_scheduler is not None and model_states.get("lr_scheduler") is not None:
        engine.lr_scheduler.load_state_dict(model_states["lr_scheduler"])
    engine.global_steps = int(model_states.get("global_steps", 0))
    engine.global_samples = int(model_states.get("global_samples", 0))
    engine.skipped_steps = int(model_states.get("skipped_steps", 0))
