"""The session's data position and trainer state: what a checkpoint holds besides the model and
optimizer, and how a resume reads it back at any world size (agent.training's Session uses it)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agent.batching import BatchPlan
from agent.checkpoint.manifest import legacy_global_samples
from agent.checkpoint.pipeline import Topology
from agent.checkpoint.state import capture_rng, restore_rng, snapshot_tree
from agent.stop import RequestPoller
from spotrelay.errors import IncompatibleCheckpointError


class SessionData:
    """Mixin: the epoch, the global sample cursor and the per-rank trainer file."""

    dataloader: Any
    lr_scheduler: Any
    stateful: dict[str, Any]
    poller: RequestPoller
    topo: Topology
    plan: BatchPlan | None
    step: int
    samples: int  # trained on by all ranks together (the manifest's ``samples``)
    _step_samples: int = 0  # this rank's count for the current step (step_done)
    epoch: int
    cursor: int
    _global_data: bool
    _iter: Iterator[Any] | None

    def _check_resizable(self, step_dir: Path, saved_world: int) -> None:
        if self.dataloader is not None and not self._global_data:
            raise IncompatibleCheckpointError(
                f"{step_dir}: saved by {saved_world} ranks, this run has {self.topo.world_size}, and its data "
                "loader's position is per rank; use agent.batching.GlobalBatchSampler (docs/training-api.md) "
                f"or resume on {saved_world} ranks"
            )

    def _trainer_state(self, request_id: str | None) -> dict[str, Any]:
        handled = sorted(self.poller.handled | ({request_id} if request_id else set()))
        return snapshot_tree({
            "step": self.step, "samples": self.samples, "samples_global": True, "epoch": self.epoch,
            "rng": capture_rng(),
            "cursor": self.cursor, "global_batch": self.plan.global_batch if self.plan else None,
            "data": self.dataloader.state_dict() if hasattr(self.dataloader, "state_dict") and not self._global_data
            else None,
            "scheduler": self.lr_scheduler.state_dict() if self.lr_scheduler is not None else None,
            "extra": {name: obj.state_dict() for name, obj in self.stateful.items()},
            "handled_requests": handled,
        })  # fmt: skip

    def _count_samples(self) -> None:
        """After a step: add what all ranks trained on (the global batch; without a batch plan,
        this rank's reported count times the world, as a DistributedSampler gives every rank alike)."""
        self.samples += self.plan.global_batch if self.plan else self._step_samples * self.topo.world_size
        self._step_samples = 0

    def _load_trainer_state(self, state: dict[str, Any], own_rng: bool = True, saved_world: int = 1) -> None:
        self.step, self.samples, self.epoch = int(state["step"]), int(state["samples"]), int(state["epoch"])
        if not state.get("samples_global"):  # saved before the count was global: rank 0's own count
            self.samples = legacy_global_samples(self.samples, self.step, saved_world, state.get("global_batch"))
        self.cursor = int(state.get("cursor", 0))
        if state["data"] is not None and hasattr(self.dataloader, "load_state_dict") and not self._global_data:
            self.dataloader.load_state_dict(state["data"])
        if state["scheduler"] is not None and self.lr_scheduler is not None:
            self.lr_scheduler.load_state_dict(state["scheduler"])
        for name, obj in self.stateful.items():
            obj.load_state_dict(state["extra"][name])
        self.poller.handled.update(state["handled_requests"])
        if self.dataloader is not None:
            self._start_epoch()  # a new loader iterator draws a seed from torch's RNG: draw it first
        if own_rng:  # a rank new to the world keeps its own seeded generators
            restore_rng(state["rng"])

    def _next_batch(self) -> Any:
        while True:
            if self._iter is None:
                self._start_epoch()
            assert self._iter is not None
            try:
                return next(self._iter)
            except StopIteration:
                self._iter, self.epoch, self.cursor = None, self.epoch + 1, 0

    def _start_epoch(self) -> None:
        loader = self.dataloader
        samplers: list[Any] = [getattr(loader, "sampler", None), getattr(loader, "batch_sampler", None)]
        for sampler in samplers:
            if hasattr(sampler, "set_epoch"):
                sampler.set_epoch(self.epoch)
        if self._global_data:  # every rank's position follows from the global cursor
            self.dataloader.batch_sampler.set_cursor(self.cursor)
        self._iter = iter(self.dataloader)
