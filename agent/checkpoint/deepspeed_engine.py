"""DeepSpeed: our own ``CheckpointEngine`` plugged into the DeepSpeed engine.

DeepSpeed's ``save_checkpoint`` decides what each rank saves (ZeRO 0-3 partitions, module
states, LR scheduler, client state) and hands every file to ``checkpoint_engine.save``. Ours
copies the file's tensors into a shared-memory arena and returns. The background thread writes a
small skeleton per file; the uploader helper writes, hashes and uploads the tensor bytes from
the arena (agent.checkpoint.arena_files). Loading reads skeletons with ``weights_only=True`` and
rebuilds tensors from raw bytes, never DeepSpeed's pickle load.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from agent.checkpoint import arena_files, deepspeed_module
from agent.checkpoint import deepspeed_reshard as reshard
from agent.checkpoint.arena import Arena, ArenaPool, arena_size
from agent.checkpoint.compat import check_optimizer_names, check_parameters, optimizer_names
from agent.checkpoint.engines import ArenaFile, Output, Snapshot
from agent.checkpoint.group_check import check_param_groups
from agent.checkpoint.manifest import Manifest
from agent.checkpoint.state import snapshot_tree
from spotrelay.errors import IncompatibleCheckpointError

try:
    from deepspeed.runtime.checkpoint_engine.checkpoint_engine import CheckpointEngine
except ImportError:  # pragma: no cover - only the DDP path runs without DeepSpeed
    CheckpointEngine = object

Pending = tuple[str, dict[str, Any], Arena, list[tuple[int, int]]]  # path, skeleton, arena, segments


class SnapshotCheckpointEngine(CheckpointEngine):
    """Snapshots each file DeepSpeed saves into an arena during ``save_checkpoint``."""

    def __init__(self) -> None:
        self.name = "SpotrelaySnapshotEngine"
        self.pending: list[Pending] = []
        self.arenas = ArenaPool()

    def create(self, info: Any) -> None:
        self.pending = []

    def save(self, state_dict: Any, path: str) -> None:
        arena = self.arenas.acquire(arena_size(state_dict))
        skeleton, segments = arena_files.split(snapshot_tree(state_dict, arena), arena)
        self.pending.append((path, skeleton, arena, segments))

    def load(self, path: str, map_location: Any = None) -> Any:
        return arena_files.load(path, map_location=map_location)

    def commit(self, info: Any) -> bool:
        return True

    def preserves_storage_sharing(self) -> bool:
        return False  # we copy every tensor ourselves; DeepSpeed's extra clone would double it

    def take(self) -> list[Pending]:
        pending, self.pending = self.pending, []
        return pending


class DeepSpeedEngine:
    kind = "deepspeed"

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.ckpt = SnapshotCheckpointEngine()
        engine.checkpoint_engine = self.ckpt

    def snapshot(self, root: Path, step_dir: Path) -> Snapshot:
        self.engine.checkpoint_engine = self.ckpt
        self.engine.save_checkpoint(str(root), tag=step_dir.name, save_latest=False)
        pending = self.ckpt.take()

        def write() -> list[Output]:
            files: list[Output] = []
            for path, skeleton, arena, segments in pending:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                torch.save(skeleton, path)
                files.append(Path(path))
                if segments:
                    files.append(ArenaFile(path=arena_files.sidecar(Path(path)), arena=arena.path, segments=segments))
            return files

        def release() -> None:
            for _, _, arena, _ in pending:
                self.ckpt.arenas.release(arena)

        return Snapshot(write=write, release=release)

    def live_shapes(self, trainable_only: bool = True) -> dict[str, tuple[int, ...]]:
        """The shapes of the parameters a ZeRO optimizer owns (its saved ``param_shapes``: none of no
        values); or (stage 0's saved list) every tensor of the state dict that is no buffer: frozen
        parameters, and a tied weight under each of its names."""
        module = self.engine.module
        if not trainable_only:
            buffers = {n for n, _ in deepspeed_module.persistent_buffers(module)}
            # the parameters themselves: a ZeRO-3 one holds no values here, its shape is its ds_shape
            tensors = module.state_dict(keep_vars=True).items()
            return {n: tuple(getattr(t, "ds_shape", t.shape)) for n, t in tensors if n not in buffers}
        params = module.named_parameters()
        return {n: tuple(getattr(p, "ds_shape", p.shape)) for n, p in params if deepspeed_module.optimized(p)}

    def load(self, root: Path, step_dir: Path, manifest: Manifest) -> None:
        stage = manifest.zero_stage
        saved_dp = int(manifest.layout.get("dp", manifest.world_size))
        resize = saved_dp != int(self.engine.dp_world_size) or stage != self.engine.zero_optimization_stage()
        resize = resize or self._other_precision(step_dir, stage)
        # the skeleton (no tensor bytes) holds the parameter shapes, the scheduler and the counters; the
        # module's tensors are mapped (read only where used) for a resize (its frozen parameters and
        # buffers) and for stage 0, which lists no parameters: its module's tensors say them
        states_file = reshard.model_states_file(step_dir, stage)
        model_states = (
            arena_files.load(states_file, lazy=True) if stage == 0 or resize else arena_files.load_skeleton(states_file)
        )
        # stage 0 saves no parameter list: its module's tensors, frozen parameters too
        check_parameters(step_dir, reshard.saved_shapes(model_states), self.live_shapes(trainable_only=stage != 0))
        self._check_optimizer(step_dir, stage, model_states)
        if resize:
            # another world (or ZeRO stage): whole tensors from every saved partition, then our slices
            trainable = [n for n, p in self.engine.module.named_parameters() if p.requires_grad]
            full = reshard.merge(step_dir, stage, saved_dp, model_states, trainable)
            try:
                reshard.scatter(self.engine, full)
            except IncompatibleCheckpointError as exc:  # name the checkpoint it came from
                raise IncompatibleCheckpointError(f"{step_dir}: {exc}") from exc
            reshard.restore_counters(self.engine, model_states)
            return
        self.engine.checkpoint_engine = self.ckpt
        path, _ = self.engine.load_checkpoint(
            str(root), tag=step_dir.name, load_optimizer_states=True, load_lr_scheduler_states=True
        )
        if path is None:
            raise FileNotFoundError(f"DeepSpeed found no checkpoint in {step_dir}")

    def _other_precision(self, step_dir: Path, stage: int) -> bool:
        """ZeRO saved with bf16 on and resumed with it off, or the reverse: DeepSpeed's own load looks only
        for its own mode's file names (``bf16_zero_pp_rank_*``: its fallback to the other never runs) and
        fails with FileNotFoundError; the reshard reads either, as at another size."""
        if stage == 0:
            return False
        mine, other = ("bf16_", "") if self.engine.bfloat16_enabled() else ("", "bf16_")
        name = "zero_pp_rank_0_mp_rank_00_optim_states.pt"
        return not (step_dir / f"{mine}{name}").is_file() and (step_dir / f"{other}{name}").is_file()

    def _check_optimizer(self, step_dir: Path, stage: int, model_states: dict[str, Any]) -> None:
        """Another optimizer (DeepSpeed would load its state into this one without a word) is refused."""
        live = self.engine.optimizer  # stage 0: the torch optimizer itself; ZeRO: its wrapper's
        base = live if isinstance(live, torch.optim.Optimizer) else getattr(live, "optimizer", None)
        if not isinstance(base, torch.optim.Optimizer):
            return  # no ZeRO optimizer (bf16 or another wrapper): its own load checks what it can
        if stage == 0:  # the torch optimizer's state dict is in the model states file
            saved = model_states.get("optimizer")
            saved = saved if isinstance(saved, dict) and "param_groups" in saved else None
        else:
            saved_file = arena_files.load_skeleton(reshard.optim_file(step_dir, 0))
            saved = reshard.base_optimizer_state(saved_file.get("optimizer_state_dict", {}), stage)
        if saved is None:
            return
        check_optimizer_names(step_dir, optimizer_names(saved), optimizer_names(base.state_dict()))
        # another ZeRO stage may group the parameters otherwise: the counts are the reshard's to match
        check_param_groups(step_dir, saved.get("param_groups"), base.param_groups, same_count=False)

    def describe(self) -> dict[str, Any]:
        e = self.engine
        return {
            "layout": {
                "dp": int(getattr(e, "dp_world_size", 1)),
                "tp": int(getattr(e, "mp_world_size", 1)),
                "pp": int(getattr(e, "num_stages", 1) or 1),
            },
            "zero_stage": int(e.zero_optimization_stage()),
        }

    def close(self) -> None:
        self.ckpt.arenas.close()
