"""Plain torch (DDP, FSDP): ``torch.distributed.checkpoint`` on its own gloo process group.

The training thread copies the model and optimizer state dicts (DTensor shards for FSDP) into
CPU memory; the background thread runs ``dcp.save`` on a separate gloo group, because its
collectives must not interleave with the training group's. DCP's ``.metadata`` is a plain
pickle, so it is scanned against an allow-list before ``dcp.load`` reads it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from agent.checkpoint.engines import Writer
from agent.checkpoint.safety import check_file
from agent.checkpoint.state import BufferPool, snapshot_tree

MODEL_DIR = "model"


class DcpEngine:
    kind = "dcp"

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model = model
        self.optimizer = optimizer
        self.distributed = dist.is_available() and dist.is_initialized()
        # Every rank calls new_group at the same point (session start), as torch requires.
        self.group = dist.new_group(backend="gloo") if self.distributed else None
        self.pool = BufferPool()

    def _rank(self) -> int:
        return dist.get_rank(self.group) if self.distributed else 0

    def snapshot(self, root: Path, step_dir: Path) -> Writer:
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        lease: list[torch.Tensor] = []
        state = snapshot_tree({"model": model_sd, "optim": optim_sd}, self.pool, lease)
        target = step_dir / MODEL_DIR
        rank = self._rank()

        def write() -> list[Path]:
            target.mkdir(parents=True, exist_ok=True)
            # no fsync here: the pipeline fsyncs each shard while it hashes and uploads it
            writer = dcp.FileSystemWriter(str(target), sync_files=False)
            dcp.save(state, storage_writer=writer, process_group=self.group, no_dist=not self.distributed)
            state.clear()
            self.pool.give_back(lease)  # written: the next snapshot may reuse these buffers
            files = sorted(target.glob(f"__{rank}_*.distcp"))
            if rank == 0:
                files.append(target / ".metadata")
            return files

        return write

    def load(self, root: Path, step_dir: Path) -> None:
        source = step_dir / MODEL_DIR
        check_file(source / ".metadata")
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        state: dict[str, Any] = {"model": model_sd, "optim": optim_sd}
        dcp.load(
            state,
            storage_reader=dcp.FileSystemReader(str(source)),
            process_group=self.group,
            no_dist=not self.distributed,
        )
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])

    def describe(self) -> dict[str, Any]:
        world = dist.get_world_size() if self.distributed else 1
        return {"layout": {"dp": world, "tp": 1, "pp": 1}, "zero_stage": 0}

    def close(self) -> None:
        if self.group is not None:
            dist.destroy_process_group(self.group)
            self.group = None
