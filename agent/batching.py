"""The global batch and the exact data order, independent of how many ranks train.

A run is defined by its global batch ``G`` (samples per optimizer step) and the order of samples
in each epoch (a permutation drawn from ``seed + epoch``), never by its world size. A world of
``W`` ranks with micro-batch ``m`` accumulates ``A = G / (m * W)`` micro-batches per step. The
only data position saved is the **global sample cursor**: how many samples of the current
epoch's order earlier steps consumed (a multiple of ``G`` at every step boundary). Any world
derives its own position from it:

    step j of the epoch covers order[cursor : cursor + G]
    micro-batch a of rank r takes order[cursor + (a * W + r) * m :][:m]

so after any sequence of world-size changes every sample of an epoch is used exactly once, in
the same global order as an uninterrupted run (the last ``size mod G`` samples of a shuffled
epoch are left out, as ``drop_last`` does; a different permutation leaves out others each epoch).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from agent.refusal import refusals
from spotrelay.errors import BatchPlanError, CheckpointFormatError, CorruptCheckpointError

log = logging.getLogger("spotrelay.training")


@dataclass(frozen=True)
class BatchPlan:
    global_batch: int
    micro_batch: int
    world_size: int
    rank: int = 0
    # the run opted in to a global batch other than its checkpoint's (plan_batch's allow_global_batch_change)
    allow_change: bool = field(default=False, compare=False)

    def __post_init__(self) -> None:
        per_step = self.micro_batch * self.world_size
        if self.micro_batch < 1 or self.global_batch < 1:
            raise BatchPlanError(f"global batch {self.global_batch} and micro-batch {self.micro_batch} must be >= 1")
        if self.global_batch % per_step:
            raise BatchPlanError(
                f"global batch {self.global_batch} cannot be split over {self.world_size} ranks of micro-batch "
                f"{self.micro_batch} (it needs a multiple of {per_step}); {self._what_to_do()}"
            )

    def _what_to_do(self) -> str:
        """Only advice that works: a micro-batch change cannot help a world that does not divide G."""
        g, m, w = self.global_batch, self.micro_batch, self.world_size
        worlds = f"run on a world size that divides {g // m}" if g % m == 0 else ""
        if g % w:
            return f"no micro-batch lets {w} ranks split it: " + (
                worlds or f"run on a world size and a micro-batch whose product divides {g}"
            )
        return f"use a micro-batch that divides {g // w}" + (f" or {worlds}" if worlds else "")

    @property
    def accumulation(self) -> int:
        """Micro-batches per rank per optimizer step (gradient accumulation steps)."""
        return self.global_batch // (self.micro_batch * self.world_size)


def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def recorded_global_batch(**config: Any) -> int | None:
    """The global batch the newest readable checkpoint was trained with (None: no checkpoint, or
    one written before the batch was recorded). Rank 0 reads it; every rank gets the same answer."""
    return _recorded(**config)[0]


def _recorded(**config: Any) -> tuple[int | None, str]:
    """(recorded global batch, the checkpoint that recorded it), the same on every rank. A manifest
    this version cannot read (a newer format) is refused on every rank, never skipped."""
    rank, _ = _world()
    found: list[tuple[int | None, str, str]] = [(None, "", "")]
    if rank == 0:
        try:
            found = [(*_newest_global_batch(**config), "")]
        except CheckpointFormatError as exc:  # every rank must learn it, or they wait in the broadcast
            found = [(None, "", str(exc))]
    if dist.is_available() and dist.is_initialized():
        dist.broadcast_object_list(found, src=0)
    recorded, where, error = found[0]
    if error:
        raise CheckpointFormatError(error)
    return recorded, where


def _newest_global_batch(**config: Any) -> tuple[int | None, str]:
    from agent.checkpoint.config import SessionConfig
    from agent.checkpoint.local_tier import LocalTier
    from agent.checkpoint.restore import candidates
    from agent.checkpoint.s3_tier import S3Tier

    cfg = SessionConfig.from_env(**config)
    local = LocalTier(cfg.checkpoint_dir)
    s3 = S3Tier(cfg.checkpoint_uri) if cfg.checkpoint_uri else None
    try:
        for step in candidates(local, s3):
            manifest, where = None, str(local.step_dir(step))
            try:
                if (local.step_dir(step) / "manifest.json").is_file():
                    manifest = local.manifest(step)
                elif s3 is not None:
                    manifest, where = s3.manifest(step), s3.step_uri(step)
            except CorruptCheckpointError:
                continue  # resume skips it too
            if manifest is not None:  # the manifest's validation made it a positive int or None
                return manifest.data_state.get("global_batch"), where
        return None, ""
    finally:
        if s3 is not None:
            s3.close()


def plan_batch(micro_batch: int, global_batch: int | None = None, **config: Any) -> BatchPlan:
    """The batch plan for this world, before the engine is built (DeepSpeed needs ``accumulation``).

    ``global_batch`` None: the one recorded in the newest checkpoint, so a resume on another
    world size keeps it; without a checkpoint, ``micro_batch * world`` (no accumulation). A
    ``global_batch`` other than the checkpoint's is refused unless ``allow_global_batch_change``
    (SPOTRELAY_ALLOW_GLOBAL_BATCH_CHANGE=1) opts in. A world that cannot divide the batch raises
    BatchPlanError before any training (naming the checkpoint when the batch came from one). Each
    refusal tells the agent (exit REFUSED, agent.refusal). ``config``: the SessionConfig defaults
    that locate the checkpoints (checkpoint_dir, ...) and the opt-in.
    """
    from agent.checkpoint.compat import check_global_batch
    from agent.checkpoint.config import SessionConfig

    cfg = SessionConfig.from_env(**config)
    rank, world = _world()
    with refusals(cfg.control_dir, world_size=world):
        recorded, where = _recorded(**config)
        chosen = global_batch or recorded or micro_batch * world
        if global_batch:
            check_global_batch(where, recorded, global_batch, cfg.allow_global_batch_change)
        try:
            return BatchPlan(global_batch=chosen, micro_batch=micro_batch, world_size=world, rank=rank,
                             allow_change=cfg.allow_global_batch_change)  # fmt: skip
        except BatchPlanError as exc:
            if global_batch or not recorded:
                raise
            raise BatchPlanError(f"{where}: trained with global batch {recorded}, which a resume keeps: {exc}") from exc


class GlobalBatchSampler:
    """A batch sampler (``DataLoader(dataset, batch_sampler=...)``) yielding this rank's
    micro-batches of each step from the global cursor; the session sets epoch and cursor."""

    def __init__(self, size: int, plan: BatchPlan, *, seed: int = 0, shuffle: bool = True) -> None:
        if size < plan.global_batch:
            raise BatchPlanError(f"the dataset has {size} samples, fewer than one global batch of {plan.global_batch}")
        self.size, self.plan, self.seed, self.shuffle = size, plan, seed, shuffle
        self.epoch = self.cursor = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def set_cursor(self, cursor: int) -> None:
        """Samples of this epoch's order already consumed; the next iterator starts there."""
        self.cursor = cursor

    def order(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(self.size))
        return torch.randperm(self.size, generator=torch.Generator().manual_seed(self.seed + epoch)).tolist()

    def __iter__(self) -> Iterator[list[int]]:
        order, cursor, p = self.order(self.epoch), self.cursor, self.plan
        while cursor + p.global_batch <= self.size:
            for micro in range(p.accumulation):
                start = cursor + (micro * p.world_size + p.rank) * p.micro_batch
                yield order[start : start + p.micro_batch]
            cursor += p.global_batch

    def __len__(self) -> int:
        return (self.size - self.cursor) // self.plan.global_batch * self.plan.accumulation
