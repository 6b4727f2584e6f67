"""Hashing and uploading off the training process: a helper process per rank, fed over a pipe.

A background thread in the trainer would share its GIL: botocore's request handling and the
pickling around it stall every small torch op of the training step. The helper process writes
shards still in a snapshot arena to the local tier, sha256s every shard and uploads them
(parallel multipart), all at once, reading the arena's shared memory directly; then it fsyncs
(periodic saves only).
Periodic saves use a helper at low CPU priority; emergency saves have a second one at full
priority. It speaks JSON lines:

    in:  {"step": N, "step_dir": "...", "rank": R, "local": true | false (S3 first: no local write, no fsync),
          "files": [{"path": "rel", "arena": "/proc/<pid>/fd/<n>" | null, "segments": [[off, len], ...]}]}
    out: {"ok": true, "shards": [{"path", "size", "sha256", "rank"}, ...], "timings": {"upload_s": ...}}
         | {"ok": false, "error": "..."}
    in:  {"exit": true}  (the last line: ends the helper even when stdin never reaches EOF)

Run as ``python -m agent.checkpoint.uploader [--emergency] [--workers N] [--max-mb-s X] [s3://bucket/prefix]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any

from agent.checkpoint.engines import ArenaFile, Output
from agent.checkpoint.manifest import Shard, fsync_file, step_name
from agent.checkpoint.s3_tier import S3Tier, set_thread_nice
from agent.checkpoint.sources import ArenaSource, FileSource, Source, SourceStream, sha256_source

BACKGROUND_NICE = 15
log = logging.getLogger("spotrelay.checkpoint")


def _rel(step_dir: Path, path: Path) -> str:
    return path.resolve().relative_to(step_dir.resolve()).as_posix()


def encode(step_dir: Path, outputs: list[Output]) -> list[dict[str, Any]]:
    """Outputs as the helper's task lists them (paths relative to the step folder)."""
    found: list[dict[str, Any]] = []
    for out in outputs:
        if isinstance(out, ArenaFile):
            found.append({"path": _rel(step_dir, out.path), "arena": out.arena, "segments": out.segments})
        else:
            found.append({"path": _rel(step_dir, out), "arena": None, "segments": []})
    return found


def _stream_digest(stream: SourceStream) -> str:
    return stream.hexdigest() or sha256_source(stream.source)


def write_locally(outputs: list[Output]) -> None:
    """Write the shards still in an arena to the local tier (used after an S3-first commit)."""
    for out in outputs:
        if isinstance(out, ArenaFile):
            source = ArenaSource(out.path, out.arena, out.segments)
            try:
                source.write_local()
            finally:
                source.close()


class ArenaUnavailable(OSError):
    """This process cannot map the trainer's arena (a host that forbids /proc/<pid>/fd access)."""


def _open(step_dir: Path, item: dict[str, Any]) -> Source:
    path = step_dir / item["path"]
    if item.get("arena"):
        try:
            return ArenaSource(path, item["arena"], [(int(o), int(n)) for o, n in item["segments"]])
        except OSError as exc:
            raise ArenaUnavailable(f"{item['arena']}: {exc}") from exc
    return FileSource(path)


def transfer(
    step_dir: Path,
    items: list[dict[str, Any]],
    rank: int,
    step: int,
    s3: S3Tier | None,
    pool: ThreadPoolExecutor,
    local: bool = True,
    timings: dict[str, float] | None = None,
) -> list[Shard]:
    """Write arena shards locally, sha256 every shard and upload them all, side by side; then fsync.

    ``local=False`` (emergencies with S3: the disk is going away, S3 is what counts) leaves the
    arena shards for ``write_locally`` after the commit, and skips the fsync: a local copy torn by
    a crash fails its sha256 on resume and the S3 copy is used instead.
    ``timings`` receives when each stage finished, in seconds from the start.
    """
    t0, clock = time.perf_counter(), {} if timings is None else timings
    sources: list[Source] = []
    try:
        sources = [_open(step_dir, item) for item in items]
        clock["map_s"] = time.perf_counter() - t0
        writes = [pool.submit(src.write_local) for src in sources if local and isinstance(src, ArenaSource)]
        # arena shards going to S3 are hashed as they are read for the upload; the rest side by side
        streams = {i: SourceStream(src) for i, src in enumerate(sources) if s3 and isinstance(src, ArenaSource)}
        hashes = {i: pool.submit(sha256_source, src) for i, src in enumerate(sources) if i not in streams}
        if s3 is not None:
            bodies = [streams.get(i) or str(src.path) for i, src in enumerate(sources)]
            s3.upload([(body, f"{step_name(step)}/{item['path']}") for body, item in zip(bodies, items, strict=True)])
        clock["upload_s"] = time.perf_counter() - t0
        digests = [hashes[i].result() if i in hashes else _stream_digest(streams[i]) for i in range(len(sources))]
        clock["sha256_s"] = time.perf_counter() - t0
        for fut in writes:
            fut.result()
        clock["local_write_s"] = time.perf_counter() - t0
        for src in sources if local else []:  # the part (this rank's "durable" claim) comes after this
            fsync_file(src.path)
        clock["fsync_s"] = time.perf_counter() - t0
    finally:
        for src in sources:
            src.close()
    return [
        Shard(path=item["path"], size=src.size, sha256=digest, rank=rank)
        for item, src, digest in zip(items, sources, digests, strict=True)
    ]


class Lane:
    """An S3 tier and a hashing/writing pool whose threads run at one CPU priority."""

    def __init__(self, uri: str | None, nice: int, workers: int = 8, max_mb_s: float | None = None) -> None:
        self.s3 = S3Tier(uri, nice=nice, workers=workers, max_mb_s=max_mb_s) if uri else None
        self.pool = ThreadPoolExecutor(3, thread_name_prefix="hash", initializer=set_thread_nice, initargs=(nice,))


def serve(
    uri: str | None, emergency: bool, stdin: IO[str], stdout: IO[str], workers: int = 8, max_mb_s: float | None = None
) -> None:
    nice = 0 if emergency else BACKGROUND_NICE
    set_thread_nice(nice)  # first, so every thread started later (upload workers too) inherits it
    lane = Lane(uri, nice, workers, max_mb_s)
    if lane.s3 is not None:
        lane.s3.warm()  # import boto3, build the client, make a first request: not while a save waits
    for line in stdin:
        task = json.loads(line)
        if task.get("exit"):  # not EOF: a process forked from the trainer may hold our stdin open
            return
        try:
            where, files, rank, step = Path(task["step_dir"]), task["files"], task["rank"], task["step"]
            timings: dict[str, float] = {}
            local = bool(task.get("local", True))
            shards = transfer(where, files, rank, step, lane.s3, lane.pool, local=local, timings=timings)
            reply: dict[str, Any] = {"ok": True, "shards": [s.model_dump() for s in shards], "timings": timings}
        except Exception as exc:  # reported to the trainer, which fails this save and keeps going
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "arena": isinstance(exc, ArenaUnavailable)}
        stdout.write(json.dumps(reply) + "\n")
        stdout.flush()


class UploaderProcess:
    """The trainer's handle on its helper; started on first use, one task at a time."""

    def __init__(
        self, uri: str | None, emergency: bool = False, workers: int = 8, max_mb_s: float | None = None
    ) -> None:
        self.uri = uri
        self.emergency = emergency
        self.options = ["--workers", str(workers), *(["--max-mb-s", str(max_mb_s)] if max_mb_s else [])]
        self._proc: subprocess.Popen[str] | None = None
        self._lock = threading.Lock()

    def run(
        self,
        step: int,
        step_dir: Path,
        rank: int,
        files: list[dict[str, Any]],
        local: bool = True,
        timings: dict[str, float] | None = None,
    ) -> list[Shard]:
        with self._lock:
            proc = self.start()
            assert proc.stdin is not None and proc.stdout is not None
            where = str(step_dir.resolve())
            task = {"step": step, "step_dir": where, "rank": rank, "files": files, "local": local}
            proc.stdin.write(json.dumps(task) + "\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the uploader process exited (code {proc.poll()})")
        reply = json.loads(line)
        if not reply["ok"]:
            if reply.get("arena"):
                raise ArenaUnavailable(f"{step_name(step)}: the uploader cannot map the arena: {reply['error']}")
            raise RuntimeError(f"{step_name(step)}: {reply['error']}")
        if timings is not None:
            timings.update(reply.get("timings", {}))
        return [Shard.model_validate(s) for s in reply["shards"]]

    def start(self) -> subprocess.Popen[str]:
        if self._proc is None or self._proc.poll() is not None:
            cmd = [sys.executable, "-m", "agent.checkpoint.uploader", *(["--emergency"] if self.emergency else [])]
            cmd += [*self.options, *([self.uri] if self.uri else [])]
            root = str(Path(__file__).resolve().parents[2])
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
            self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        return self._proc

    def close(self, timeout: float = 30.0) -> None:
        """Ask the helper to exit and wait for it. Closing stdin alone is not enough: a process
        forked from the trainer after the helper started (a DataLoader worker) inherits the pipe's
        write end, so the helper would see no EOF until every such process exited."""
        proc, self._proc = self._proc, None
        if proc is None or proc.stdin is None:
            return
        try:  # no lock: a transfer stuck past the flush timeout must not block the close
            proc.stdin.write(json.dumps({"exit": True}) + "\n")
            proc.stdin.flush()
            proc.stdin.close()
        except OSError:  # the helper is already gone
            pass
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning("the uploader helper (pid %d) did not exit in %.0f s; killing it", proc.pid, timeout)
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def main() -> None:
    parser = argparse.ArgumentParser(description="spotrelay checkpoint uploader (started by the trainer)")
    parser.add_argument("--emergency", action="store_true", help="full CPU priority (emergency saves)")
    parser.add_argument("--workers", type=int, default=8, help="parallel part uploads")
    parser.add_argument("--max-mb-s", type=float, default=None, help="upload bandwidth cap, MB/s")
    parser.add_argument("uri", nargs="?", default=None)
    args = parser.parse_args()
    serve(args.uri, args.emergency, sys.stdin, sys.stdout, args.workers, args.max_mb_s)


if __name__ == "__main__":
    main()
