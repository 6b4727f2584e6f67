"""A run's training progress: where the gang's step is, what is checkpointed, what work still counts.

Half of ``engine.Run`` (the other half is the event loop, the nodes, the market's events and billing):
a gang trains from ``start_training`` until ``stop_training`` or the end of the job; the step reached
at t is computed, not simulated (engine.py's docstring), so only the segment's start and its end are
events. Useful GPU-hours are the segments whose steps reach the final model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from spotrelay.sim import losses
from spotrelay.sim.job import REF_TYPE, JobModel
from spotrelay.sim.records import Metrics, SimNode


class Training:
    """The training state of one run (``engine.Run`` inherits it and keeps the clock)."""

    job: JobModel
    now: float
    gang: dict[int, SimNode]  # rank -> node of the current attempt
    metrics: Metrics
    loss_gpu_s: dict[str, float]

    def __init__(self, job: JobModel) -> None:
        self.total = job.total_steps
        self.ckpt_step = 0  # newest committed checkpoint
        self.running = False
        self.epoch = 0  # bumps whenever a training segment starts or stops (stale timers die)
        self.seg_t0 = self.seg_step0 = 0.0
        self.step_eff = self.step_pure = self.step_pure_eff = 1.0
        self.every = 1
        self.seg_gpus = 0
        self.forced: list[tuple[float, int]] = []  # (commit time, step) of notice/rebalance saves
        self.useful: list[list[float]] = []  # [start_step, end_step, step_s, gpus] that still count
        self.stopped_at: float | None = None  # training stopped at (for the recovery time)
        self.seg_nodes: list[SimNode] = []
        self._speed: dict[str, float] = {}  # instance type -> job.speed (end_node's billing)
        # checkpoint GB sent between the checkpoints' region and gang nodes elsewhere (saves and restores);
        # billed at ``job.transfer_usd_per_gb`` (runner.measure)
        self.transfer_gb = 0.0

    def at(self, t: float, fn: Callable[..., None], arg: Any = None) -> None:
        raise NotImplementedError  # (the event loop's: engine.Run)

    def start_training(self, instance_type: str, gpus: int, world: int | None = None) -> None:
        """``world`` ranks (an elastic gang, default the job's nodes) keep the global batch: a step
        takes nodes / world times longer and is worth the same useful GPU-hours."""
        self.running = True
        self.epoch += 1
        self.seg_t0, self.seg_step0 = self.now, float(self.ckpt_step)
        self.step_pure = self.job.step_s(REF_TYPE)  # useful hours in reference (H100) GPU-hours
        scale = self.job.nodes / world if world else 1.0
        self.every = max(1, round(self.checkpoint_every_steps(instance_type) / scale))
        self.step_eff = (self.job.step_s(instance_type) + self.job.stall_s(instance_type) / self.every) * scale
        self.step_pure_eff = self.job.step_s(instance_type) * scale  # the same without the snapshot stall
        self.seg_gpus = self.job.nodes * self.job.ref_gpus()
        self.seg_nodes = list(self.gang.values())
        if self.ckpt_step > 0:  # new ranks read their shards from the bucket (survivors: their local tier)
            self.transfer_gb += self._remote_gb(new_only=True)
        losses.segment_started(self.seg_nodes, self.now, self.job.restore_s())
        if self.stopped_at is not None:
            self.metrics.recovery_s.append(self.now - self.stopped_at)
            self.metrics.recoveries += 1
            self.stopped_at = None
        self.at(self.now + (self.total - self.seg_step0) * self.step_eff, self._done, self.epoch)

    def checkpoint_every_steps(self, instance_type: str) -> int:
        """Full-gang steps between periodic checkpoints in this segment: the job's cadence (spotrelay's
        trainers may choose their own: ``checkpoint.every_minutes: auto``)."""
        return self.job.every_steps(instance_type)

    def step_at(self, t: float) -> float:
        if not self.running:
            return float(self.ckpt_step)
        return min(float(self.total), self.seg_step0 + max(0.0, t - self.seg_t0) / self.step_eff)

    def committed(self, t: float) -> int:
        """The newest checkpoint durable in S3 at ``t``."""
        best = self.ckpt_step
        if self.running:
            reached = self.step_at(t - self.job.persist_s())
            periodic = int(reached // self.every) * self.every
            if periodic > best and periodic > self.seg_step0:
                best = periodic
        for when, step in self.forced:
            if when <= t and step > best:
                best = step
        return best

    def force_checkpoint(self, t: float, commit_t: float) -> int:
        step = int(self.step_at(t) + 1e-6)
        self.forced.append((commit_t, step))
        return step

    def stop_training(self, resume_from: int) -> None:
        """Training stops now and will resume from ``resume_from`` (work after it is lost)."""
        reached = int(self.step_at(self.now) + 1e-6) if self.running else self.ckpt_step
        if self.running:
            self.useful.append([self.seg_step0, float(reached), self.step_pure, float(self.seg_gpus)])
            self.stopped_at = self.now
            # resuming from a step that is neither a periodic save nor a notice's: the ranks saved it as
            # they stopped (the notice's flush, a budget's or a deadline's stop)
            at_stop = (resume_from > self.seg_step0 and resume_from % self.every != 0
                       and all(step != resume_from for _, step in self.forced))
            self._segment_ended(reached, 1 if at_stop else 0)
        self.running = False
        self.epoch += 1
        self.forced.clear()
        resume_from = min(resume_from, reached)
        self.metrics.steps_lost += max(0, reached - resume_from)
        while self.useful and self.useful[-1][1] > resume_from:  # redone work does not count
            seg = self.useful[-1]
            if seg[0] >= resume_from:
                self.useful.pop()
            else:
                seg[1] = float(resume_from)
                break
        self.ckpt_step = resume_from

    def _done(self, epoch: int) -> None:
        if epoch != self.epoch or not self.running:
            return
        self.useful.append([self.seg_step0, float(self.total), self.step_pure, float(self.seg_gpus)])
        self._segment_ended(self.total)
        self.running = False
        self.ckpt_step = self.total
        self.on_training_done()

    def _segment_ended(self, reached: float, stop_saves: int = 0) -> None:
        """The training segment's nodes trained until now; the snapshot stall's share of it is counted, and
        the checkpoints it sent: every periodic save it started (uploaded in the background, committed or
        not), every notice or rebalance save and ``stop_saves`` taken as the ranks stopped."""
        saves = int(reached // self.every) - int(self.seg_step0 // self.every) + len(self.forced) + stop_saves
        if saves > 0:
            self.transfer_gb += saves * self._remote_gb()
        took = self.now - self.seg_t0
        stall = took * (1.0 - self.step_pure_eff / self.step_eff) if self.step_eff > 0 else 0.0
        losses.segment_ended(self.loss_gpu_s, self.seg_nodes, self.now, took, stall, self._node_speed)

    def _remote_gb(self, new_only: bool = False) -> float:
        """GB of one checkpoint that cross regions: each rank's share, for the segment's ranks outside the
        checkpoints' region (``new_only``: those that never trained, which have no local copy)."""
        home = self.job.checkpoint_region
        if not self.seg_nodes or home is None or self.job.transfer_usd_per_gb <= 0:
            return 0.0
        remote = sum(1 for n in self.seg_nodes
                     if n.pool.pool.region != home and not (new_only and n.trained_s > 0))
        return self.job.checkpoint_bytes / 1e9 * remote / len(self.seg_nodes)

    def _node_speed(self, node: SimNode) -> float:
        """The job's speed on ``node``'s instance type (kept per type: billing asks for every node)."""
        itype = node.pool.pool.instance_type
        speed = self._speed.get(itype)
        if speed is None:
            speed = self._speed[itype] = self.job.speed(itype)
        return speed

    def useful_gpu_hours(self) -> float:
        return sum((e - s) * step_s * gpus for s, e, step_s, gpus in self.useful) / 3600.0

    def on_training_done(self) -> None: ...
