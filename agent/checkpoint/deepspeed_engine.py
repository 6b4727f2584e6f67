"""DeepSpeed: our own ``CheckpointEngine`` plugged into the DeepSpeed engine.

DeepSpeed's ``save_checkpoint`` decides what each rank saves (ZeRO 0-3 partitions, module
states, LR scheduler, client state) and hands every file to ``checkpoint_engine.save``. Ours
copies the tensors into CPU memory and returns; the background thread ``torch.save``s them.
Loading goes through ``safe_torch_load`` (weights_only), never DeepSpeed's pickle load.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from agent.checkpoint.engines import Output, Snapshot
from agent.checkpoint.safety import safe_torch_load
from agent.checkpoint.state import BufferPool, snapshot_tree

try:
    from deepspeed.runtime.checkpoint_engine.checkpoint_engine import CheckpointEngine
except ImportError:  # pragma: no cover - only the DDP path runs without DeepSpeed
    CheckpointEngine = object


class SnapshotCheckpointEngine(CheckpointEngine):
    """Collects (path, CPU copy) pairs during ``save_checkpoint``; writes them later."""

    def __init__(self) -> None:
        self.name = "SpotrelaySnapshotEngine"
        self.pending: list[tuple[str, Any]] = []
        self.pool = BufferPool()
        self.lease: list[torch.Tensor] = []

    def create(self, info: Any) -> None:
        self.pending, self.lease = [], []

    def save(self, state_dict: Any, path: str) -> None:
        self.pending.append((path, snapshot_tree(state_dict, self.pool, self.lease)))

    def load(self, path: str, map_location: Any = None) -> Any:
        return safe_torch_load(path, map_location=map_location)

    def commit(self, info: Any) -> bool:
        return True

    def preserves_storage_sharing(self) -> bool:
        return False  # we copy every tensor ourselves; DeepSpeed's extra clone would double it

    def take(self) -> tuple[list[tuple[str, Any]], list[torch.Tensor]]:
        pending, lease, self.pending, self.lease = self.pending, self.lease, [], []
        return pending, lease


class DeepSpeedEngine:
    kind = "deepspeed"

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.ckpt = SnapshotCheckpointEngine()
        engine.checkpoint_engine = self.ckpt

    def snapshot(self, root: Path, step_dir: Path) -> Snapshot:
        self.engine.checkpoint_engine = self.ckpt
        self.engine.save_checkpoint(str(root), tag=step_dir.name, save_latest=False)
        pending, lease = self.ckpt.take()

        def write() -> list[Output]:
            files: list[Output] = []
            for path, state in pending:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                torch.save(state, path)
                files.append(Path(path))
            pending.clear()
            self.ckpt.pool.give_back(lease)  # written: the next snapshot may reuse these buffers
            lease.clear()
            return files

        return Snapshot(write=write)

    def load(self, root: Path, step_dir: Path) -> None:
        self.engine.checkpoint_engine = self.ckpt
        path, _ = self.engine.load_checkpoint(
            str(root), tag=step_dir.name, load_optimizer_states=True, load_lr_scheduler_states=True
        )
        if path is None:
            raise FileNotFoundError(f"DeepSpeed found no checkpoint in {step_dir}")

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
        return None
