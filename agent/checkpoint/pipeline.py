"""The background half of a save: write, hash, commit locally, upload, commit in S3, report.

One worker thread per rank takes save jobs in order. Per job:

1. run the engine's writer and write the trainer state (the training thread already copied both);
2. fsync + sha256 each file, then write ``parts/rank-<R>.json`` (this rank's shards are durable);
3. local rank 0 waits for every part of its node, writes ``manifest.json``, moves ``latest``;
4. with S3: each rank uploads its shards (parallel multipart), then its part; global rank 0
   waits for all parts in S3, writes the manifest, moves ``latest`` and prunes beyond keep_s3;
5. local rank 0 of each node appends ``checkpoint_committed`` to events.jsonl once the global
   commit is visible (its own, or the manifest in S3), then prunes the local tier.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.checkpoint.engines import Writer
from agent.checkpoint.local_tier import LocalTier
from agent.checkpoint.manifest import Manifest, RankPart, describe_shards, merge_parts, step_name
from agent.checkpoint.s3_tier import S3Tier
from agent.checkpoint.state import save_trainer_state, trainer_file
from spotrelay.contracts.control import TrainerEvent, append_event

log = logging.getLogger("spotrelay.checkpoint")


@dataclass(frozen=True)
class Topology:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1

    @property
    def node_ranks(self) -> range:
        first = self.rank - self.local_rank
        return range(first, first + self.local_world_size)


@dataclass
class SaveJob:
    step: int
    writer: Writer
    trainer_state: dict[str, Any]
    manifest_fields: dict[str, Any]
    emergency: bool = False
    started: float = field(default_factory=time.time)
    deadline: float | None = None
    request_id: str | None = None
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    uri: str = ""
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.done.is_set() and self.error is None


class Pipeline:
    def __init__(
        self,
        local: LocalTier,
        s3: S3Tier | None,
        topology: Topology,
        control_dir: Path | None,
        keep_local: int = 2,
        keep_s3: int = 5,
        timeout_s: float = 900.0,
    ) -> None:
        self.local, self.s3, self.topo = local, s3, topology
        self.control_dir = control_dir
        self.keep_local, self.keep_s3, self.timeout_s = keep_local, keep_s3, timeout_s
        self._queue: queue.Queue[SaveJob | threading.Event] = queue.Queue()
        self._skip_before = -1
        self._thread = threading.Thread(target=self._run, name="spotrelay-ckpt", daemon=True)
        self._thread.start()

    def submit(self, job: SaveJob) -> SaveJob:
        if job.emergency:
            self._skip_before = job.step  # queued periodic saves are superseded: go at full speed
        self._queue.put(job)
        return job

    def flush(self, timeout: float | None = None) -> None:
        marker = threading.Event()
        self._queue.put(marker)
        marker.wait(timeout)

    def close(self) -> None:
        self.flush(self.timeout_s)
        if self.s3 is not None:
            self.s3.close()

    # --- worker ----------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if isinstance(job, threading.Event):
                job.set()
                continue
            if job.step < self._skip_before and not job.emergency:
                job.error = RuntimeError(f"{step_name(job.step)} superseded by an emergency save")
                job.done.set()
                continue
            try:
                self._process(job)
            except BaseException as exc:  # a failed save must not kill training; the next one retries
                job.error = exc
                log.error("checkpoint %s failed: %s", step_name(job.step), exc, exc_info=True)
            finally:
                job.done.set()

    def _manifest(self, job: SaveJob, parts: list[RankPart]) -> Manifest:
        ranks, shards = merge_parts(parts)
        return Manifest(
            step=job.step,
            ranks=ranks,
            shards=shards,
            world_size=self.topo.world_size,
            request_id=job.request_id,
            created=time.time(),
            **job.manifest_fields,
        )

    def _process(self, job: SaveJob) -> None:
        topo, step_dir, t0 = self.topo, self.local.step_dir(job.step), time.perf_counter()
        files = job.writer()
        state_file = trainer_file(step_dir, topo.rank)
        save_trainer_state(state_file, job.trainer_state)
        shards = describe_shards(step_dir, [*files, state_file], topo.rank)
        part = RankPart(step=job.step, rank=topo.rank, shards=shards)
        self.local.write_part(part)
        job.timings["write_s"] = time.perf_counter() - t0
        if topo.local_rank == 0:
            node_parts = self.local.wait_parts(job.step, topo.node_ranks, self.timeout_s)
            self.local.commit(self._manifest(job, node_parts))
        job.uri = str(step_dir)
        if self.s3 is not None:
            self._upload(job, part, step_dir)
        job.timings["commit_s"] = time.perf_counter() - t0
        if topo.local_rank == 0:
            self._report(job)
            self.local.prune(self.keep_local, protect={job.step})

    def _upload(self, job: SaveJob, part: RankPart, step_dir: Path) -> None:
        assert self.s3 is not None
        folder = step_name(job.step)
        t1 = time.perf_counter()
        self.s3.upload_files([(step_dir / s.path, f"{folder}/{s.path}") for s in part.shards])
        self.s3.write_part(part)
        job.timings["upload_s"] = time.perf_counter() - t1
        if self.topo.rank == 0:
            parts = self.s3.wait_parts(job.step, self.topo.world_size, self.timeout_s)
            self.s3.commit(self._manifest(job, parts))
            self.s3.prune(self.keep_s3)
        elif self.topo.local_rank == 0:
            self.s3.wait_manifest(job.step, self.timeout_s)
        job.uri = self.s3.step_uri(job.step)

    def _report(self, job: SaveJob) -> None:
        duration = time.time() - job.started
        log.info(
            "checkpoint %s committed at %s in %.2f s%s",
            step_name(job.step),
            job.uri,
            duration,
            " (emergency)" if job.emergency else "",
        )
        if self.control_dir is not None:
            event = TrainerEvent(
                kind="checkpoint_committed", step=job.step, uri=job.uri, duration_s=duration,
                emergency=job.emergency, deadline=job.deadline, request_id=job.request_id, time=time.time(),
            )  # fmt: skip
            append_event(self.control_dir, event)
