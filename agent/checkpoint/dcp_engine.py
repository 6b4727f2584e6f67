"""Plain torch (DDP, FSDP): ``torch.distributed.checkpoint`` on its own gloo process group.

The training thread copies the model and optimizer state dicts (DTensor shards for FSDP) into a
shared-memory arena. The background thread runs ``dcp.save`` on a separate gloo group (its
collectives must not interleave with the training group's) with our storage writer, which
plans the files and leaves the tensor bytes in the arena for the uploader helper to write
(agent.checkpoint.dcp_storage). Loading scans every pickle DCP would unpickle first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from agent.checkpoint.arena import ArenaPool, arena_size
from agent.checkpoint.compat import check_optimizer, check_parameters
from agent.checkpoint.dcp_storage import ArenaStorageWriter, load, saved_layout
from agent.checkpoint.engines import Output, Snapshot
from agent.checkpoint.group_check import check_param_groups
from agent.checkpoint.manifest import Manifest
from agent.checkpoint.state import snapshot_tree

MODEL_DIR = "model"


class DcpEngine:
    kind = "dcp"

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model = model
        self.optimizer = optimizer
        self.distributed = dist.is_available() and dist.is_initialized()
        # Every rank calls new_group at the same point (session start), as torch requires.
        self.group = dist.new_group(backend="gloo") if self.distributed else None
        self.arenas = ArenaPool()

    def snapshot(self, root: Path, step_dir: Path) -> Snapshot:
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        live = {"model": model_sd, "optim": optim_sd}
        arena = self.arenas.acquire(arena_size(live))
        state = snapshot_tree(live, arena)
        target = step_dir / MODEL_DIR

        def write() -> list[Output]:
            writer = ArenaStorageWriter(target, arena)
            dcp.save(state, storage_writer=writer, process_group=self.group, no_dist=not self.distributed)
            state.clear()
            return writer.outputs

        return Snapshot(write=write, release=lambda: self.arenas.release(arena))

    def load(self, root: Path, step_dir: Path, manifest: Manifest) -> None:
        """DCP reshards by itself: each rank reads the saved chunks that overlap its own tensors."""
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        live = {k: tuple(v.shape) for k, v in model_sd.items() if isinstance(v, torch.Tensor)}
        shapes, optim_keys = saved_layout(step_dir / MODEL_DIR)
        check_parameters(step_dir, shapes, live)
        check_optimizer(step_dir, optim_keys, optim_sd)
        # a copy: the load writes the saved groups over these
        own_groups = [dict(group) for group in optim_sd.get("param_groups", []) if isinstance(group, dict)]
        state: dict[str, Any] = {"model": model_sd, "optim": optim_sd}
        load(state, step_dir / MODEL_DIR, process_group=self.group, no_dist=not self.distributed)
        check_param_groups(step_dir / MODEL_DIR, state["optim"].get("param_groups"), own_groups)
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])

    def describe(self) -> dict[str, Any]:
        world = dist.get_world_size() if self.distributed else 1
        return {"layout": {"dp": world, "tp": 1, "pp": 1}, "zero_stage": 0}

    def close(self) -> None:
        if self.group is not None:
            dist.destroy_process_group(self.group)
            self.group = None
        self.arenas.close()
