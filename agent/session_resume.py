"""How a session finds, agrees on and loads its checkpoint: every rank the same step, checked against
the job's training definition and batch before anything loads, a blip in S3 waited out
(agent.training's Session uses it)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from agent.checkpoint.compat import check_global_batch, check_manifest
from agent.checkpoint.config import SessionConfig
from agent.checkpoint.engines import Engine
from agent.checkpoint.local_tier import LocalTier
from agent.checkpoint.pipeline import Topology
from agent.checkpoint.restore import Refusal, agree_on_step
from agent.checkpoint.s3_tier import S3Tier
from agent.checkpoint.state import load_trainer_state, trainer_file
from agent.refusal import refusals
from agent.session_data import SessionData
from agent.stop import all_ok
from spotrelay.contracts.control import TrainerEvent
from spotrelay.errors import CheckpointUnavailableError

log = logging.getLogger("spotrelay.training")
# checkpoints S3 would not give (CheckpointUnavailableError): asked again after these waits before the
# attempt ends as an infrastructure failure (a blip should not cost the gang a relaunch)
RESUME_RETRY_S = (10.0, 30.0)
_sleep = time.sleep  # (the tests' seam: patching time.sleep would reach every thread)


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


class SessionResume(SessionData):
    """Mixin: ``resume`` (the newest checkpoint every rank holds, or the newest before a step)."""

    config: SessionConfig
    engine: Engine
    local: LocalTier
    s3: S3Tier | None
    topo: Topology
    plan: Any
    stateful: dict[str, Any]
    _device: str
    resumed_from: int | None
    _last_saved: int
    resume_seconds: float | None
    _event: Callable[[TrainerEvent], None]

    def resume(self, before: int | None = None) -> int | None:
        """Load the newest valid checkpoint (every rank the same step, older than ``before`` when
        given); return its step or None."""
        started = time.monotonic()
        step = self._agree_on_checkpoint(before)
        if step is None:
            return None
        barrier()
        manifest = self.local.manifest(step)
        step_dir = self.local.step_dir(step)
        cfg = self.config
        saved_world = manifest.world_size
        own = self.topo.rank < saved_world  # a rank the saved world did not have takes rank 0's counters
        with refusals(cfg.control_dir, self.topo.world_size):  # checked before anything loads
            check_manifest(manifest, step_dir, self.engine.kind, cfg.spec_hash, cfg.code_hash, cfg.allow_spec_change,
                           training_hash=cfg.training_hash)
            if self.plan is not None:
                check_global_batch(step_dir, manifest.data_state.get("global_batch"), self.plan.global_batch,
                                   cfg.allow_global_batch_change or self.plan.allow_change)  # fmt: skip
            if saved_world != self.topo.world_size:
                self._check_resizable(step_dir, saved_world)
            self.engine.load(self.local.root, step_dir, manifest)
            state = load_trainer_state(trainer_file(step_dir, self.topo.rank if own else 0), self.stateful)
        self._load_trainer_state(state, own, saved_world)
        self.resumed_from = self._last_saved = step
        self.resume_seconds = time.monotonic() - started
        log.info("resumed from step %d (%s), saved by %d ranks, now %d", step, step_dir, saved_world,
                 self.topo.world_size)  # fmt: skip
        self._event(TrainerEvent(kind="resumed", step=step, uri=str(step_dir), time=time.time()))
        return step

    def _agree_on_checkpoint(self, before: int | None) -> int | None:
        def share(step: int | Refusal | None) -> int | Refusal | None:
            chosen = [step]
            if dist.is_initialized():
                dist.broadcast_object_list(chosen, src=0)
            return chosen[0]

        fetch_here = self.topo.local_rank == 0 and self.topo.rank != 0  # another node: fetch from S3

        def agree() -> int | None:
            return agree_on_step(self.topo.rank == 0, fetch_here, self.local, self.s3, before, share,
                                 lambda ok: all_ok(ok, self._device))

        with refusals(self.config.control_dir, self.topo.world_size):  # a newer format; none usable or readable
            for wait in RESUME_RETRY_S:
                try:
                    return agree()
                except CheckpointUnavailableError as exc:  # raised on every rank alike: they retry together
                    log.warning("checkpoints unreadable now, asking again in %.0f s: %s", wait, exc)
                    _sleep(wait)
            return agree()  # the last try: its CheckpointUnavailableError ends the attempt
