"""The simulated job: how long a step takes where, what a checkpoint costs, how long a restore takes.

Defaults describe a stated job, derived in docs/simulator.md from what bench/checkpoint.py measured:
a 70B-parameter model trained with ZeRO-3 (bf16 weights, fp32 master + two Adam moments: 16 bytes per
parameter, 1.12 TB of checkpoint), 2M tokens per step, 16 x p5.48xlarge (128 H100) at 40% MFU:
6 x 70e9 x 2.1e6 / (128 x 989e12 x 0.4) = 17 s per step. Step time scales with 16 / nodes
(same global batch) and with the catalog's throughput for other types (p4d.24xlarge: 2.8x slower).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from spotrelay.domain.cadence import trainer_interval_s
from spotrelay.placement import catalog
from spotrelay.spec.models import Checkpoint, JobSpec

CHECKPOINT_BYTES = 70e9 * 16  # ZeRO-3 model + optimizer state
REF_NODES, REF_TYPE, REF_STEP_S = 16, "p5.48xlarge", 17.0


def _gpus(instance_type: str) -> int:
    info = catalog.instance(instance_type)
    return info.gpus if info else 8


@dataclass(frozen=True)
class JobModel:
    nodes: int = 16
    job_hours: float = 168.0  # hours of training on REF_TYPE at full speed (sets total_steps)
    checkpoint_minutes: float = 30.0  # periodic checkpoint cadence (placement's assumed default)
    snapshot_gbps: float = 12.0  # GB/s GPU -> host per GPU (the stall is 1.13x a bare copy, bench)
    s3_gbps: float = 5.0  # GB/s to or from S3 per node (40 Gbit/s of the ENA share)
    flush_overhead: float = 1.21  # emergency flush / plain upload (bench/checkpoint.py)
    bringup_s: float = 120.0  # NCCL/EFA bring-up and framework start after boot
    notice_s: float = 120.0
    strategy: str | None = None  # None: the spec's default (recovery.strategy)
    steps: int | None = None  # total steps (overrides job_hours)
    # a time-boxed job: it stops this many wall hours after its start, done or not, and its model is the
    # steps it reached (its last save is taken then); None: it runs until its steps are done
    deadline_hours: float | None = None
    ref_step_s: float = REF_STEP_S  # step time of REF_NODES x REF_TYPE
    checkpoint_bytes: float = CHECKPOINT_BYTES
    max_recoveries: int | None = None  # the spec's default: no lifetime cap (max_stalled_recoveries stays)
    # Where the checkpoints live: the shipped default ``checkpoint.s3_prefix`` is the home region's jobs
    # bucket (None: the run's first region). A gang elsewhere sends each save there and reads each restore
    # from there; at ``transfer_usd_per_gb`` a GB (AWS charges 0.02 between US regions and EU -> US;
    # sim/training.py). Off by default until placement weighs it (docs/simulator.md, "Checkpoints between
    # regions"): the published numbers were measured without it.
    checkpoint_region: str | None = None
    transfer_usd_per_gb: float = 0.0

    def step_s(self, instance_type: str) -> float:
        info, ref = catalog.instance(instance_type), catalog.instance(REF_TYPE)
        tput = info.throughput if info else 1.0
        assert ref is not None
        return self.ref_step_s * (REF_NODES / self.nodes) * ref.throughput / tput

    def speed(self, instance_type: str) -> float:
        """Work per GPU-second relative to REF_TYPE (paid GPU-hours are counted in REF_TYPE's)."""
        return self.step_s(REF_TYPE) * self.ref_gpus() / (self.step_s(instance_type) * _gpus(instance_type))

    def ref_gpus(self) -> int:
        return _gpus(REF_TYPE)

    @property
    def total_steps(self) -> int:
        if self.steps is not None:
            return self.steps
        return max(1, int(self.job_hours * 3600 / self.step_s(REF_TYPE)))

    def bytes_per_node(self) -> float:
        return self.checkpoint_bytes / self.nodes

    def stall_s(self, instance_type: str) -> float:
        info = catalog.instance(instance_type)
        gpus = info.gpus if info else 8
        return 1.13 * self.bytes_per_node() / gpus / (self.snapshot_gbps * 1e9)

    def flush_s(self) -> float:
        """Notice -> emergency checkpoint committed in S3 (snapshot + upload + commit)."""
        return self.flush_overhead * self.bytes_per_node() / (self.s3_gbps * 1e9)

    def persist_s(self) -> float:
        """A periodic checkpoint reaches S3 this long after its snapshot (background upload)."""
        return self.bytes_per_node() / (self.s3_gbps * 1e9)

    def restore_s(self) -> float:
        """After boot: bring-up plus loading this node's shards from S3."""
        return self.bringup_s + self.bytes_per_node() / (self.s3_gbps * 1e9)

    def every_steps(self, instance_type: str) -> int:
        return self._steps_in(self.checkpoint_minutes * 60, instance_type)

    def _steps_in(self, seconds: float, instance_type: str) -> int:
        return max(1, round(seconds / self.step_s(instance_type)))

    def spec_every_steps(self, ckpt: Checkpoint, instance_type: str, loss_interval: float | None) -> int:
        """Steps between periodic saves under the spec's checkpoint section: ``every_steps`` or
        ``every_minutes``, whichever first; with ``every_minutes: auto``, what the trainers choose from the
        attempt's ``loss_interval`` and this job's stall and upload (the agent's rule, domain/cadence.py)."""
        if ckpt.auto:
            seconds = trainer_interval_s(self.stall_s(instance_type), self.persist_s(), loss_interval,
                                         ckpt.auto_min_minutes * 60.0, ckpt.auto_max_minutes * 60.0)
        else:
            seconds = (ckpt.fixed_minutes or math.inf) * 60.0
        steps = [self._steps_in(seconds, instance_type)] if math.isfinite(seconds) else []
        steps += [ckpt.every_steps] if ckpt.every_steps is not None else []
        return min(steps) if steps else self.every_steps(instance_type)

    def checkpoint_hints(self) -> dict[str, object]:
        """What a team states so placement weighs its checkpoints' distance (``checkpoint.size_gb`` and
        ``region``): given when the run charges that transfer, so the default runs decide as before."""
        if self.transfer_usd_per_gb <= 0 or self.checkpoint_region is None:
            return {}
        return {"size_gb": self.checkpoint_bytes / 1e9, "region": self.checkpoint_region}

    def spec(self, regions: list[str], instance_types: list[str], markets: list[str]) -> JobSpec:
        """The job spec the controller's decisions read (placement, strategy, retry budget)."""
        return JobSpec.model_validate({
            "version": 1, "name": "sim", "entrypoint": {"command": ["python", "train.py"]},
            "resources": {"nodes": self.nodes, "regions": regions, "instance_types": instance_types,
                          "markets": markets},
            "checkpoint": {"every_minutes": self.checkpoint_minutes, **self.checkpoint_hints()},
            "recovery": {**({"max_recoveries": self.max_recoveries} if self.max_recoveries is not None else {}),
                         # (an empty one, `--switch strategy=`, is refused by the spec, not read as unset)
                         **({"strategy": self.strategy} if self.strategy is not None else {})},
        })
