"""The training API: resume, steps, periodic and requested checkpoints, a meaningful exit code.

    session = spotrelay_session(model_engine, dataloader=loader)     # or model=, optimizer=
    for step, batch in session.steps(max_steps):
        loss = ...; model_engine.backward(loss); model_engine.step()
        session.step_done(loss)
    sys.exit(session.close())

See docs/training-api.md.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from agent.batching import BatchPlan, GlobalBatchSampler
from agent.cadence import AutoCadence
from agent.checkpoint.config import SessionConfig
from agent.checkpoint.engines import Engine
from agent.checkpoint.local_tier import LocalTier
from agent.checkpoint.pipeline import Pipeline, SaveJob, Topology
from agent.checkpoint.s3_tier import S3Tier
from agent.notice_window import Margin, NoticeTraining, SaveLike
from agent.session_health import SessionHealth
from agent.session_resume import SessionResume, barrier
from agent.stop import RequestPoller, agree, all_ok, any_rank, gather_ids
from spotrelay.contracts.control import ENV_ATTEMPT, RequestKind, TrainerEvent, append_event, write_progress
from spotrelay.contracts.exit_codes import ExitCode
from spotrelay.contracts.health import HealthAction, HealthAnomaly
from spotrelay.errors import BatchPlanError

log = logging.getLogger("spotrelay.training")
_monotonic = time.monotonic  # (the tests' seam for the periodic cadence)


def _topology() -> Topology:
    if dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        rank, world = 0, 1
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    return Topology(rank=rank, world_size=world, local_rank=local_rank, local_world_size=local_world)


class Session(SessionResume):
    _attempt: int | None = None  # SPOTRELAY_ATTEMPT, stamped on every trainer event
    _first_step_seen = False
    def __init__(
        self,
        engine: Engine,
        config: SessionConfig,
        dataloader: Any = None,
        lr_scheduler: Any = None,
        stateful: dict[str, Any] | None = None,
        batch: BatchPlan | None = None,
    ) -> None:
        self.engine, self.config = engine, config
        self.dataloader, self.lr_scheduler = dataloader, lr_scheduler
        self.stateful = dict(stateful or {})
        self.topo = _topology()
        self.local = LocalTier(config.checkpoint_dir)
        self.s3 = S3Tier(config.checkpoint_uri, workers=config.upload_workers) if config.checkpoint_uri else None
        self.pipeline = Pipeline(
            self.local, self.s3, self.topo, config.control_dir,
            keep_local=config.keep_local, keep_s3=config.keep_s3, timeout_s=config.commit_timeout_s, offload=True,
            background=(config.background_upload_workers, config.background_upload_mb_s),
        )  # fmt: skip
        self.poller = RequestPoller(config.control_dir)
        self.step = self.samples = self.epoch = self.cursor = 0
        self._global_data = isinstance(getattr(dataloader, "batch_sampler", None), GlobalBatchSampler)
        self.plan = batch or (dataloader.batch_sampler.plan if self._global_data else None)
        if self.plan is not None and self.plan.world_size != self.topo.world_size:
            raise BatchPlanError(f"the batch plan is for {self.plan.world_size} ranks, not {self.topo.world_size}")
        self.accumulation = self.plan.accumulation if self.plan else 1
        self.resume_seconds: float | None = None
        attempt = os.environ.get(ENV_ATTEMPT, "")
        self._attempt = int(attempt) if attempt.isdigit() else None
        self.pipeline.attempt = self._attempt
        self.resumed_from: int | None = None
        self.exit_code = ExitCode.DONE
        self.last_loss: float | None = None
        self._last_saved = -1
        self._save_requested = False
        self.last_job: SaveJob | None = None
        self._last_save_time = _monotonic()
        self.cadence = (AutoCadence(config.loss_interval_s, config.auto_min_minutes * 60, config.auto_max_minutes * 60)
                        if config.auto else None)  # fmt: skip
        self._iter: Iterator[Any] | None = None
        self._skip = 0  # batches to draw and drop before the next step (a rollback's bad window)
        self._device = "cuda" if dist.is_initialized() and dist.get_backend() == "nccl" else "cpu"
        self.health = SessionHealth(config.health, self.topo.rank, self.topo.world_size,
                                    self.topo.local_world_size, config.control_dir, engine, lr_scheduler)
        # training through a spot notice: this rank's flush and step times, the agreed window
        margin = Margin(config.notice_margin_s, config.notice_margin_share)
        self.notice = NoticeTraining(margin, config.flush_prior_mb_s)

    # --- the loop ----------------------------------------------------------------------------------
    def steps(self, max_steps: int) -> Iterator[tuple[int, Any]]:
        """Yield (step index, batch) from where the last checkpoint left off until ``max_steps``."""
        if self.accumulation != 1:
            raise BatchPlanError(f"this world accumulates {self.accumulation} micro-batches a step: use micro_steps()")
        for step, _micro, batch in self.micro_steps(max_steps):
            yield step, batch

    def micro_steps(self, max_steps: int) -> Iterator[tuple[int, int, Any]]:
        """Yield (step, micro-batch index, batch), ``accumulation`` micro-batches per optimizer step."""
        if self.resumed_from is None:
            self.resume()
        while self.step < max_steps:
            while self._skip > 0 and self.dataloader is not None:  # a skipped step: all its micro-batches
                self._skip -= 1
                for _ in range(self.accumulation):
                    self._next_batch()
                self.cursor += self.plan.global_batch if self.plan else 0
            for micro in range(self.accumulation):
                batch = self._next_batch() if self.dataloader is not None else None
                yield self.step, micro, batch
            self.step += 1
            self.cursor += self.plan.global_batch if self.plan else 0
            self._count_samples()
            if self._boundary(max_steps):
                return
        if self.config.save_final and self._last_saved != self.step and self.step > 0:
            w = self.notice.window  # finished inside a notice window: the last save is an emergency one
            if w is None:
                self.save()
            else:
                self.save(emergency=True, deadline=w.deadline, request_id=w.request_id)

    def step_done(self, loss: Any = None, samples: int | None = None, grad_norm: Any = None) -> None:
        """Record the step's loss, this rank's sample count and the gradient norm (for the manifest's
        global count, the health checks and the metrics; DeepSpeed's grad norm is read from the
        engine when not given)."""
        if loss is not None:
            self.last_loss = float(loss.detach()) if isinstance(loss, torch.Tensor) else float(loss)
        self._step_samples = samples or 0
        self.health.step_done(self.last_loss if loss is not None else None, grad_norm, samples)

    def skip_batches(self, count: int) -> None:
        """Draw and drop ``count`` batches before the next step (every rank must call it alike)."""
        self._skip += max(count, 0)

    def _boundary(self, max_steps: int) -> bool:
        """After each step: progress, one collective, then save/stop as agreed. True ends the loop."""
        cfg, now = self.config, time.time()
        if cfg.control_dir is not None and self.topo.local_rank == 0:
            write_progress(cfg.control_dir, self.step)
        if not self._first_step_seen:  # training is back: downtime ends here (docs/local-twin.md)
            self._first_step_seen = True
            self._event(TrainerEvent(kind="first_step", step=self.step, time=now))
        self.notice.boundary(now)
        request = self.poller.poll()
        interval = self._interval_s()
        due = interval is not None and _monotonic() - self._last_save_time >= interval
        decision = agree(request, due, self._device, self.health.extra(self.step), self.notice.final_due(now))
        request_id = None
        if decision.kind is not None:  # every rank learns the ids, so none acts on them again
            ids = gather_ids(request.request_id if request is not None else None)
            self.poller.handled.update(ids)
            request_id = ids[0] if ids else None
        if decision.kind is RequestKind.STOP:
            self.exit_code = ExitCode.CANCELLED
            self._event(TrainerEvent(kind="stopping", step=self.step, request_id=request_id, time=time.time()))
            return True
        finding = self.health.judge(self.step, decision.extra)
        if finding is not None and self._on_anomaly(finding):
            return True
        if self.notice.window is not None:  # no other saves in the window: the bandwidth is the final save's
            w, snapshot = self.notice.window, self.notice.snapshot
            if decision.final_due and finding is None:  # an unhealthy step is never saved
                job = self.save(emergency=True, deadline=w.deadline, request_id=w.request_id)
                return self._stop_after(job, w.deadline, w.request_id, fallback=snapshot)
            if decision.final_due and snapshot is not None:
                return self._stop_after(snapshot, w.deadline, w.request_id)
            if decision.kind is RequestKind.CHECKPOINT_AND_STOP:
                w.tighten(decision.deadline)  # another node's notice: the earliest deadline wins
            return False
        if decision.kind is RequestKind.CHECKPOINT_AND_STOP:
            return self._notice(decision.deadline, request_id)
        periodic = bool(cfg.every_steps and self.step % cfg.every_steps == 0 and self.step < max_steps)
        wanted = decision.kind is RequestKind.CHECKPOINT or periodic or decision.checkpoint_due or self._save_requested
        if wanted and finding is not None:  # an unhealthy step is never saved: the next healthy one is
            self._save_requested = True
        elif wanted:
            self._save_requested = False
            self.save(request_id=request_id)
        return False

    def _interval_s(self) -> float | None:
        """Seconds between time-based saves: the spec's, or from the market (auto); None: by steps only."""
        if self.cadence is None:
            minutes = self.config.fixed_minutes
            return minutes * 60 if minutes else None
        moved = self.cadence.boundary()
        if moved is not None and self.topo.local_rank == 0:
            c, loss = self.cadence, self.config.loss_interval_s
            log.info("checkpoint cadence (auto): every %.1f min (stall %.2f s, a loss without notice every %s, "
                     "floor %.1f min)", moved / 60, c.stall_s, f"{loss / 3600:.1f} h" if loss else "never",
                     c.floor_s / 60)  # fmt: skip
        return self.cadence.interval_s

    # --- health ------------------------------------------------------------------------------------
    def _on_anomaly(self, finding: HealthAnomaly) -> bool:
        """Act on an agreed finding; True ends the loop (exit UNHEALTHY)."""
        if finding.action is HealthAction.ROLLBACK:
            finding = self._rollback(finding)
        self._event(TrainerEvent(kind="anomaly", step=finding.step, anomaly=finding, time=time.time()))
        if finding.action is HealthAction.STOP:
            self.exit_code = ExitCode.UNHEALTHY
            return True
        return False  # replace-node and notify: the agent reports it, the controller acts

    def _rollback(self, finding: HealthAnomaly) -> HealthAnomaly:
        """Restore the newest checkpoint older than the finding's step and skip the data in between."""
        self.pipeline.flush()  # the newest healthy save may still be on its way
        resumed_from = self.resumed_from
        restored = self.resume(before=finding.step)
        self.resumed_from = resumed_from
        if restored is None:
            return finding.model_copy(update={"action": HealthAction.STOP,
                                              "detail": f"{finding.detail}; no checkpoint before it"})
        skipped = finding.step - restored
        self.skip_batches(skipped)
        self.health.rolled_back(restored)
        log.warning("health: rolled back to step %d, skipping %d batch(es)", restored, skipped)
        return finding.model_copy(update={"rollback_to": restored, "skipped_batches": skipped})

    # --- a spot notice -----------------------------------------------------------------------------
    def _notice(self, deadline: float | None, request_id: str | None) -> bool:
        """Snapshot now (committed in the background); keep training when every rank can still fit
        a final save before the deadline, else this snapshot is the last one: wait for it, stop."""
        job = self.save(emergency=True, deadline=deadline, request_id=request_id)
        if not self.config.notice_training or deadline is None:
            return self._stop_after(job, deadline, request_id)
        now = time.time()
        if any_rank(self.notice.no_room(now, deadline), self._device):
            return self._stop_after(job, deadline, request_id)
        flush = self.notice.open(deadline, now, self.step, request_id, job)
        log.info("notice at step %d: training on; a final save is predicted to take %.1f s", self.step, flush)
        self._event(TrainerEvent(kind="notice_training", step=self.step, deadline=deadline, request_id=request_id,
                                 time=now))  # fmt: skip
        return False

    def _stop_after(
        self, job: SaveLike, deadline: float | None, request_id: str | None, fallback: SaveLike | None = None
    ) -> bool:
        """Wait for ``job``'s global commit (or ``fallback``'s: the notice-time snapshot), then stop."""
        wait = (deadline - time.time()) if deadline else self.config.commit_timeout_s
        ok = job.done.wait(max(wait, 1.0)) and job.error is None
        if not ok and fallback is not None:  # the final save failed or is late: the notice one counts
            left = (deadline - time.time()) if deadline else self.config.commit_timeout_s
            ok = fallback.done.wait(max(left, 1.0)) and fallback.error is None
            log.warning("the final save did not commit in time; the notice-time snapshot %s", "did" if ok else "failed")
        # Nobody exits before the global commit: torchrun stops the whole group on a first exit.
        ok = all_ok(ok, self._device)
        self.exit_code = ExitCode.PREEMPTED_SAVED if ok else ExitCode.PREEMPTED_UNSAVED
        self._event(TrainerEvent(kind="stopping", step=self.step, request_id=request_id, time=time.time()))
        return True

    # --- saving ------------------------------------------------------------------------------------
    def request_checkpoint(self) -> None:
        """Save at the end of the current step. Every rank must call it in the same step."""
        self._save_requested = True

    def save(self, emergency: bool = False, deadline: float | None = None, request_id: str | None = None) -> SaveJob:
        """Snapshot now (blocks only for the in-memory copy); the pipeline writes and uploads."""
        started = time.time()
        step_dir = self.local.step_dir(self.step)
        snapshot = self.engine.snapshot(self.local.root, step_dir)
        fields = {
            "job_id": self.config.job_id, "engine": self.engine.kind, "samples": self.samples,
            "data_state": {"epoch": self.epoch, "step": self.step, "samples": self.samples, "cursor": self.cursor,
                           "global_batch": self.plan.global_batch if self.plan else None,
                           "micro_batch": self.plan.micro_batch if self.plan else None},
            "spec_hash": self.config.training_hash or self.config.spec_hash, "code_hash": self.config.code_hash,
            **self.engine.describe(),
        }  # fmt: skip
        job = SaveJob(
            step=self.step, snapshot=snapshot, trainer_state=self._trainer_state(request_id), manifest_fields=fields,
            emergency=emergency, started=started, deadline=deadline, request_id=request_id,
        )  # fmt: skip
        job.timings["snapshot_s"] = time.time() - started  # what the training loop waited for
        self._last_saved, self._last_save_time = self.step, _monotonic()
        if self.cadence is not None:
            self.cadence.saved(job, job.timings["snapshot_s"])
        self.last_job = job
        self.notice.saved(job)
        return self.pipeline.submit(job)

    def close(self) -> int:
        """Wait for pending uploads (the final checkpoint included); return the exit code."""
        self.pipeline.close()
        self.health.close()
        barrier()  # ranks leave together: torchrun stops the group when the first one exits
        self.engine.close()
        return int(self.exit_code)

    def _event(self, event: TrainerEvent) -> None:
        if self.config.control_dir is not None and self.topo.local_rank == 0:
            append_event(self.config.control_dir, event.model_copy(
                update={"attempt": self._attempt, "world_size": self.topo.world_size}))


def spotrelay_session(
    model: Any,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    lr_scheduler: Any = None,
    dataloader: Any = None,
    stateful: dict[str, Any] | None = None,
    batch: BatchPlan | None = None,
    **config: Any,
) -> Session:
    """A Session for a DeepSpeed engine, or for a torch model (plain, DDP or FSDP) and optimizer.

    ``config`` holds SessionConfig defaults (checkpoint_dir, every_steps, ...); the SPOTRELAY_*
    environment set by the agent overrides them.
    """
    cfg = SessionConfig.from_env(**config)
    engine: Engine
    if hasattr(model, "save_checkpoint") and hasattr(model, "load_checkpoint"):
        from agent.checkpoint.deepspeed_engine import DeepSpeedEngine

        engine = DeepSpeedEngine(model)
        plan = batch or getattr(getattr(dataloader, "batch_sampler", None), "plan", None)
        if plan is not None and int(model.gradient_accumulation_steps()) != plan.accumulation:
            raise BatchPlanError(
                f"the DeepSpeed config has gradient_accumulation_steps {model.gradient_accumulation_steps()}, "
                f"the batch plan needs {plan.accumulation} (global batch {plan.global_batch}); "
                "build the config from agent.batching.plan_batch"
            )
    else:
        if optimizer is None:
            raise ValueError("a plain torch model needs its optimizer")
        from agent.checkpoint.dcp_engine import DcpEngine

        engine = DcpEngine(model, optimizer)
    Path(cfg.checkpoint_dir).mkdir(parents=True, exist_ok=True)
    return Session(engine, cfg, dataloader=dataloader, lr_scheduler=lr_scheduler, stateful=stateful, batch=batch)
