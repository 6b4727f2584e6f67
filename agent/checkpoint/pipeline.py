"""The background half of a save: write, hash, commit locally, upload, commit in S3, report.

One worker thread per rank takes save jobs in order. Per job:

1. run the snapshot's writer and write the trainer state (the training thread already copied
   both); shards still in a shared-memory arena are left to step 2;
2. in the uploader helper: write arena shards locally, sha256 every shard and (with S3) upload it,
   all side by side, then fsync; then write ``parts/rank-<R>.json`` (this rank's shards are durable);
3. local rank 0 waits for every part of its node, writes ``manifest.json``, moves ``latest``;
4. with S3: each rank uploads its part; global rank 0 waits for all parts in S3, writes the
   manifest, moves ``latest`` and (not in an emergency) prunes beyond keep_s3;
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

from agent.checkpoint.engines import ArenaFile, Output, Snapshot
from agent.checkpoint.local_tier import LocalTier
from agent.checkpoint.manifest import Manifest, RankPart, merge_parts, step_name
from agent.checkpoint.s3_tier import S3Tier
from agent.checkpoint.state import save_trainer_state, trainer_file
from agent.checkpoint.uploader import ArenaUnavailable, Lane, UploaderProcess, encode, transfer, write_locally
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
    snapshot: Snapshot
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
    nbytes: int = 0  # what this rank writes for the save; known once the plan is written
    total_bytes: int | None = None  # the whole checkpoint, on the rank that commits the durable manifest

    @property
    def flush_s(self) -> float:
        """Snapshot + plan + transfer + commit: what a final save before a deadline takes."""
        return sum(self.timings.get(k, 0.0) for k in ("snapshot_s", "write_s", "commit_s"))

    @property
    def ok(self) -> bool:
        return self.done.is_set() and self.error is None


class Pipeline:
    """Writes run in order on one thread (DCP's collectives need the same order on every rank);
    transfers of periodic saves run in order on a low-priority lane; an emergency save gets a
    thread and a full-priority helper of its own, so it never queues behind a periodic upload."""

    def __init__(
        self,
        local: LocalTier,
        s3: S3Tier | None,
        topology: Topology,
        control_dir: Path | None,
        keep_local: int = 2,
        keep_s3: int = 5,
        timeout_s: float = 900.0,
        offload: bool = False,
        background: tuple[int, float | None] = (2, None),
    ) -> None:
        self.local, self.s3, self.topo = local, s3, topology
        self.attempt: int | None = None  # stamped on its commit events (the session sets it)
        self.control_dir = control_dir
        self.keep_local, self.keep_s3, self.timeout_s = keep_local, keep_s3, timeout_s
        self._writes: queue.Queue[SaveJob | threading.Event] = queue.Queue()
        self._transfers: queue.Queue[tuple[SaveJob, list[Output]] | threading.Event] = queue.Queue()
        self._urgent: list[threading.Thread] = []
        self._inflight: set[int] = set()
        self._commit_lock = threading.Lock()
        # offload: hash and upload in helper processes (agent.checkpoint.uploader), off our GIL
        uri = s3.uri if s3 else None
        # periodic saves: `background` = (connections, MB/s cap); emergencies: every connection the tier has
        workers, mb_s = background
        self.uploaders: dict[bool, UploaderProcess] = {}
        if offload:
            self.uploaders[False] = UploaderProcess(uri, emergency=False, workers=workers, max_mb_s=mb_s)
            self.uploaders[True] = UploaderProcess(uri, emergency=True, workers=s3.workers if s3 else 8)
            self.uploaders[True].start()  # warm, so an emergency pays no start-up
        self._lane = Lane(None, 0)  # in-process hashing and local writes when not offloaded
        for target, name in ((self._write_loop, "ckpt-write"), (self._transfer_loop, "ckpt-transfer")):
            threading.Thread(target=target, name=name, daemon=True).start()

    def submit(self, job: SaveJob) -> SaveJob:
        self._inflight.add(job.step)
        self._writes.put(job)
        return job

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every job submitted so far is finished (committed or failed)."""
        marker = threading.Event()
        self._writes.put(marker)
        marker.wait(timeout)
        for thread in list(self._urgent):
            thread.join(timeout)

    def close(self) -> None:
        self.flush(self.timeout_s)
        for uploader in self.uploaders.values():
            uploader.close()
        if self.s3 is not None:
            self.s3.close()

    # --- workers ---------------------------------------------------------------------------------
    def _write_loop(self) -> None:
        while True:
            job = self._writes.get()
            if isinstance(job, threading.Event):
                self._transfers.put(job)  # the transfer lane sets it once it is drained too
                continue
            try:
                files = self._write(job)
            except BaseException as exc:
                self._fail(job, exc)
                continue
            if job.emergency:
                thread = threading.Thread(target=self._finish, args=(job, files), name="ckpt-urgent", daemon=True)
                self._urgent.append(thread)
                thread.start()
            else:
                self._transfers.put((job, files))

    def _transfer_loop(self) -> None:
        while True:
            item = self._transfers.get()
            if isinstance(item, threading.Event):
                item.set()
            else:
                self._finish(*item)

    def _fail(self, job: SaveJob, exc: BaseException) -> None:
        # a failed save must not kill training; the next one tries again
        job.snapshot.release()
        job.error = exc
        log.error("checkpoint %s failed: %s", step_name(job.step), exc, exc_info=True)
        self._inflight.discard(job.step)
        job.done.set()

    def _finish(self, job: SaveJob, files: list[Output]) -> None:
        try:
            self._transfer_and_commit(job, files)
        except BaseException as exc:
            self._fail(job, exc)
            return
        job.snapshot.release()
        self._inflight.discard(job.step)
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

    def _write(self, job: SaveJob) -> list[Output]:
        t0 = time.perf_counter()
        files = job.snapshot.write()
        state_file = trainer_file(self.local.step_dir(job.step), self.topo.rank)
        save_trainer_state(state_file, job.trainer_state)
        job.timings["write_s"] = time.perf_counter() - t0
        return [*files, state_file]

    def _transfer_and_commit(self, job: SaveJob, files: list[Output]) -> None:
        """Periodic: local commit, then S3. Emergency with S3: S3 first (the disk is going away);
        the arena shards reach the local tier only after the report, so they cost the deadline nothing."""
        topo, step_dir, t0 = self.topo, self.local.step_dir(job.step), time.perf_counter()
        s3_first = job.emergency and self.s3 is not None
        uploader = self.uploaders.get(job.emergency)
        items = encode(step_dir, files)
        job.nbytes = sum(f.size if isinstance(f, ArenaFile) else f.stat().st_size for f in files)
        helper: dict[str, float] = {}
        shards = None
        if uploader is not None:
            try:
                shards = uploader.run(job.step, step_dir, topo.rank, items, local=not s3_first, timings=helper)
            except ArenaUnavailable as exc:  # a host that hides our memory from the helper
                log.warning("%s; transferring in the trainer process instead", exc)
        if shards is None:
            shards = transfer(step_dir, items, topo.rank, job.step, self.s3, self._lane.pool, not s3_first, helper)
        job.timings.update({f"helper_{k}": v for k, v in helper.items()})
        part = RankPart(step=job.step, rank=topo.rank, shards=shards)
        job.timings["hash_upload_s"] = time.perf_counter() - t0
        if not s3_first:
            self._commit_local(job, part)
            job.uri = str(step_dir)
        if self.s3 is not None:
            self._commit_s3(job, part)
        job.timings["commit_s"] = time.perf_counter() - t0
        if topo.local_rank == 0:
            self._report(job)
        if s3_first:
            write_locally(files)
            self._commit_local(job, part)
            job.timings["local_copy_s"] = time.perf_counter() - t0
        if topo.local_rank == 0:
            with self._commit_lock:
                self.local.prune(self.keep_local, protect=self._inflight | {job.step})

    def _commit_local(self, job: SaveJob, part: RankPart) -> None:
        self.local.write_part(part)
        if self.topo.local_rank == 0:
            node_parts = self.local.wait_parts(job.step, self.topo.node_ranks, self.timeout_s)
            with self._commit_lock:
                self.local.commit(self._manifest(job, node_parts))

    def _commit_s3(self, job: SaveJob, part: RankPart) -> None:
        assert self.s3 is not None
        self.s3.write_part(part)
        if self.topo.rank == 0:
            parts = self.s3.wait_parts(job.step, self.topo.world_size, self.timeout_s, have=part)
            with self._commit_lock:
                manifest = self._manifest(job, parts)
                self.s3.commit(manifest)
                job.total_bytes = manifest.total_bytes
                if not job.emergency:  # the node is going away: retention can wait for the next save
                    self.s3.prune(self.keep_s3, protect=self._inflight | {job.step})
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
                stall_s=job.timings.get("snapshot_s"), attempt=self.attempt, world_size=self.topo.world_size,
                total_bytes=job.total_bytes,
            )  # fmt: skip
            append_event(self.control_dir, event)
