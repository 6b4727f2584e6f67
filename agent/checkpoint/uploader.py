"""Hashing and uploading off the training process: a helper process per rank, fed over a pipe.

A background thread in the trainer would share its GIL: botocore's request handling and the
pickling around it stall every small torch op of the training step. The helper process fsyncs
and hashes the shards while it uploads them (parallel multipart), at low CPU priority for
periodic saves; emergency saves have a second helper at full priority. It speaks JSON lines:

    in:  {"step": N, "step_dir": "...", "rank": R, "files": ["rel", ...]}
    out: {"ok": true, "shards": [{"path", "size", "sha256", "rank"}, ...]} | {"ok": false, "error": "..."}

Run as ``python -m agent.checkpoint.uploader [--emergency] [s3://bucket/prefix]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any

from agent.checkpoint.manifest import Shard, describe_shards, fsync_file, step_name
from agent.checkpoint.s3_tier import S3Tier, set_thread_nice

BACKGROUND_NICE = 15


def transfer(
    step_dir: Path,
    rels: list[str],
    rank: int,
    step: int,
    s3: S3Tier | None,
    pool: ThreadPoolExecutor,
    fsync_late: bool = False,
) -> list[Shard]:
    """sha256 every file while uploading them all; fsync them too, before or (``fsync_late``,
    emergencies: S3 first, the disk is going away) after the upload; the shards once all is done."""
    fsync_late = fsync_late and s3 is not None
    hashes = [pool.submit(describe_shards, step_dir, [step_dir / rel], rank, not fsync_late) for rel in rels]
    if s3 is not None:
        s3.upload_files([(step_dir / rel, f"{step_name(step)}/{rel}") for rel in rels])
    shards = [shard for fut in hashes for shard in fut.result()]
    if fsync_late:  # the local part is still written only after its shards are durable
        for rel in rels:
            fsync_file(step_dir / rel)
    return shards


class Lane:
    """An S3 tier and a hashing pool whose threads run at one CPU priority."""

    def __init__(self, uri: str | None, nice: int) -> None:
        self.s3 = S3Tier(uri, nice=nice) if uri else None
        self.pool = ThreadPoolExecutor(2, thread_name_prefix="hash", initializer=set_thread_nice, initargs=(nice,))


def serve(uri: str | None, emergency: bool, stdin: IO[str], stdout: IO[str]) -> None:
    lane = Lane(uri, 0 if emergency else BACKGROUND_NICE)
    if lane.s3 is not None:
        _ = lane.s3.client  # import boto3 and build the client now, not when the first save is waiting
    for line in stdin:
        task = json.loads(line)
        try:
            where, files, rank, step = Path(task["step_dir"]), task["files"], task["rank"], task["step"]
            shards = transfer(where, files, rank, step, lane.s3, lane.pool, fsync_late=emergency)
            reply: dict[str, Any] = {"ok": True, "shards": [s.model_dump() for s in shards]}
        except Exception as exc:  # reported to the trainer, which fails this save and keeps going
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        stdout.write(json.dumps(reply) + "\n")
        stdout.flush()


class UploaderProcess:
    """The trainer's handle on its helper; started on first use, one task at a time."""

    def __init__(self, uri: str | None, emergency: bool = False) -> None:
        self.uri = uri
        self.emergency = emergency
        self._proc: subprocess.Popen[str] | None = None
        self._lock = threading.Lock()

    def run(self, step: int, step_dir: Path, rank: int, files: list[str]) -> list[Shard]:
        with self._lock:
            proc = self.start()
            assert proc.stdin is not None and proc.stdout is not None
            where = str(step_dir.resolve())
            task = {"step": step, "step_dir": where, "rank": rank, "files": files}
            proc.stdin.write(json.dumps(task) + "\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the uploader process exited (code {proc.poll()})")
        reply = json.loads(line)
        if not reply["ok"]:
            raise RuntimeError(f"{step_name(step)}: {reply['error']}")
        return [Shard.model_validate(s) for s in reply["shards"]]

    def start(self) -> subprocess.Popen[str]:
        if self._proc is None or self._proc.poll() is not None:
            cmd = [sys.executable, "-m", "agent.checkpoint.uploader", *(["--emergency"] if self.emergency else [])]
            cmd += [self.uri] if self.uri else []
            root = str(Path(__file__).resolve().parents[2])
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
            self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        return self._proc

    def close(self) -> None:
        if self._proc is not None and self._proc.stdin is not None:
            self._proc.stdin.close()
            try:
                self._proc.wait(30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        self._proc = None


def main() -> None:
    parser = argparse.ArgumentParser(description="spotrelay checkpoint uploader (started by the trainer)")
    parser.add_argument("--emergency", action="store_true", help="full CPU priority, fsync after the upload")
    parser.add_argument("uri", nargs="?", default=None)
    args = parser.parse_args()
    serve(args.uri, args.emergency, sys.stdin, sys.stdout)


if __name__ == "__main__":
    main()
