"""The module's tensors besides its trainable parameters, for a DeepSpeed resume at another size or stage.

The optimizer's partitions hold only the parameters it steps. Frozen parameters (``requires_grad`` off:
a fine-tune's base weights, a frozen encoder) and persistent buffers (running statistics, counters)
are in the model-states files instead: whole in ``module`` for stages 0-2; for ZeRO-3, each frozen
parameter as every rank's partition in its own file's ``frozen_param_fragments``, and the buffers
whole in ``module`` (ZeRO-3 does not partition buffers). *Merge* describes them as whole tensors
(views of the mapped files); *scatter* copies them into the live module (ZeRO-3: this rank's piece
of each frozen parameter). The names and shapes must be the live module's, as DeepSpeed's own strict
load requires at the same size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from agent.checkpoint import arena_files
from agent.checkpoint.flat_view import FlatView, joined
from spotrelay.errors import IncompatibleCheckpointError


@dataclass
class ModuleTensors:
    """Whole frozen parameters and persistent buffers, by name, with their shapes."""

    frozen: dict[str, FlatView] = field(default_factory=dict)
    buffers: dict[str, FlatView] = field(default_factory=dict)
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def add(self, kind: dict[str, FlatView], name: str, view: FlatView, shape: tuple[int, ...]) -> None:
        if view.numel != math.prod(shape):
            raise IncompatibleCheckpointError(f"{name}: the checkpoint holds {view.numel} values, the shape {shape}")
        kind[name], self.shapes[name] = view, shape


def zero3_states_file(step_dir: Path, rank: int) -> Path:
    """ZeRO-3's model-states file of ``rank`` (each rank writes one; the other stages, rank 0 only)."""
    return step_dir / f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt"


def merge(step_dir: Path, stage: int, world: int, model_states: dict[str, Any], trainable: set[str]) -> ModuleTensors:
    """``model_states``: the (rank 0) model-states file, loaded with its tensors; ``trainable``: the
    saved names the optimizer's partitions hold."""
    module = model_states.get("module") or {}
    names = list(model_states.get("buffer_names") or [])
    out = ModuleTensors()
    for name in names:
        value = module.get(name)
        if isinstance(value, torch.Tensor):
            out.add(out.buffers, name, FlatView([value.reshape(-1)]), tuple(value.shape))
    if stage == 3:
        shapes = model_states.get("frozen_param_shapes") or {}
        if shapes:  # each rank's file holds its piece of each, in rank order
            pieces = [arena_files.load(zero3_states_file(step_dir, r), lazy=True).get("frozen_param_fragments") or {}
                      for r in range(world)]
            for name, shape in shapes.items():
                numel = math.prod(shape)
                if any(name not in p for p in pieces):
                    raise IncompatibleCheckpointError(f"{step_dir}: a rank's file misses frozen parameter {name}")
                view = joined([FlatView([p[name].reshape(-1)]) for p in pieces]).slice(0, numel)
                out.add(out.frozen, name, view, tuple(shape))
        return out
    # stages 0-2 save the whole module: what the optimizer does not step is frozen (ZeRO-2 lists them;
    # a tied weight's second name is in ``shared_params``, or, on stages 0-1, left for check to tell)
    listed = model_states.get("frozen_param_shapes")
    aliases = set(model_states.get("shared_params") or {})
    for name, value in module.items():
        if (listed is not None and name not in listed) or name in trainable or name in out.buffers or name in aliases:
            continue
        if isinstance(value, torch.Tensor):
            out.add(out.frozen, name, FlatView([value.reshape(-1)]), tuple(value.shape))
    return out


def _shape(param: torch.Tensor) -> tuple[int, ...]:
    return tuple(getattr(param, "ds_shape", param.shape))


def _numel(shape: tuple[int, ...]) -> int:
    """(A parameter of no values is saved among the frozen ones whatever it is: DeepSpeed's rule.)"""
    return int(math.prod(shape))


def optimized(param: torch.Tensor) -> bool:
    """What a ZeRO optimizer owns (DeepSpeed's ``is_optimized_parameter``): a trainable parameter with
    values. One of no values is left out of its partitions and saved with the frozen ones."""
    return bool(param.requires_grad) and _numel(_shape(param)) > 0


def check(saved: ModuleTensors, engine: Any) -> None:
    """The live module's frozen parameters and persistent buffers are the saved ones, shape for shape."""
    module = engine.module
    params = dict(module.named_parameters())
    live = {n: _shape(p) for n, p in params.items() if not p.requires_grad and _numel(_shape(p))}
    buffers = {n: tuple(b.shape) for n, b in persistent_buffers(module)}
    # a name the state dict has but no parameter or buffer goes by is a tied weight's second name: its
    # first one counts
    aliases = set(module.state_dict()) - set(params) - set(buffers)
    frozen = {n: s for n, s in saved.shapes.items() if n in saved.frozen and _numel(s) and n not in aliases}
    problems = [f"frozen parameter {n} is not in the checkpoint" for n in sorted(set(live) - set(frozen))]
    problems += [f"the checkpoint's frozen parameter {n} is " + ("trained here" if n in params else "not in this model")
                 for n in sorted(set(frozen) - set(live))]
    problems += [f"buffer {n} is not in the checkpoint" for n in sorted(set(buffers) - set(saved.buffers))]
    problems += [f"the checkpoint's buffer {n} is not in this model" for n in sorted(set(saved.buffers) - set(buffers))]
    both = {**live, **buffers}
    problems += [f"{n}: shape {saved.shapes[n]} in the checkpoint, {both[n]} here"
                 for n in sorted(both) if n in saved.shapes and saved.shapes[n] != both[n]]
    if problems:
        raise IncompatibleCheckpointError("; ".join(problems[:5]) + (f" (and {len(problems) - 5} more)"
                                                                     if len(problems) > 5 else ""))


def persistent_buffers(module: torch.nn.Module, prefix: str = "") -> list[tuple[str, torch.Tensor]]:
    """What a state dict holds of the buffers, named as DeepSpeed's ``buffer_names`` are: each parent
    names its children, so a submodule under two parents has its buffers under both names
    (``named_modules`` would name them once, and the second parent's would be refused as unknown)."""
    out = [(prefix + name, buf) for name, buf in module.named_buffers(recurse=False)
           if buf is not None and name not in module._non_persistent_buffers_set]
    for name, child in module.named_children():
        out += persistent_buffers(child, f"{prefix}{name}.")
    return out


def scatter(engine: Any, saved: ModuleTensors) -> None:
    """Copy the saved frozen parameters and buffers into the live module."""
    check(saved, engine)
    module = engine.module
    with torch.no_grad():
        for name, buf in persistent_buffers(module):
            buf.copy_(saved.buffers[name].whole(name, saved.shapes[name]).to(buf.dtype))
        for name, param in module.named_parameters():
            if param.requires_grad or name not in saved.frozen:
                continue
            view = saved.frozen[name]
            if hasattr(param, "ds_tensor"):  # ZeRO-3: this rank's piece, zero-padded past the end
                _scatter_partition(engine, param, view)
            else:
                param.data.copy_(view.whole(name, saved.shapes[name]).to(param.dtype))


def _scatter_partition(engine: Any, param: Any, view: FlatView) -> None:
    import torch.distributed as dist

    rank = dist.get_rank(group=engine.optimizer.dp_process_group)
    set_zero3_param(param, rank_piece(view, int(param.ds_tensor.ds_numel), rank), view)


def rank_piece(view: FlatView, part: int, rank: int) -> torch.Tensor:
    """ZeRO-3's partition ``rank`` of a whole tensor: its ``part`` values from ``part * rank``, zero-padded
    past the tensor's end."""
    mine = torch.zeros(part, dtype=view.dtype)
    have = max(0, min(part, view.numel - part * rank))
    if have:
        view.copy_into(part * rank, mine.narrow(0, 0, have))
    return mine


def set_zero3_param(param: Any, piece: torch.Tensor, view: FlatView) -> None:
    """A ZeRO-3 parameter's own partition from ``piece``; a persistent one is also held whole (``view``)."""
    with torch.no_grad():
        param.ds_tensor.data.copy_(piece[: param.ds_tensor.numel()].to(param.ds_tensor.dtype))
        if param.numel() == view.numel:
            param.data.copy_(view.whole("", tuple(param.shape)).view_as(param).to(param.dtype))
