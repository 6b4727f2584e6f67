"""The durable tier: S3 under ``s3://bucket/checkpoints/<job>/``, same layout as the local tier.

Files go up as parallel multipart uploads (s3transfer), read from disk or straight from a snapshot
arena (agent.checkpoint.sources).
Objects become visible in this order: shards, ``parts/rank-<R>.json``, ``manifest.json``,
``latest``; a reader trusts nothing without a manifest.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import io
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError

from agent.checkpoint.manifest import (
    LATEST,
    MANIFEST,
    MAX_MANIFEST_BYTES,
    PARTS_DIR,
    Manifest,
    RankPart,
    parse_step,
    part_name,
    read_manifest,
    same_step,
    step_name,
)

log = logging.getLogger("spotrelay.checkpoint")
MiB = 1 << 20


def parse_uri(uri: str) -> tuple[str, str]:
    if not uri.startswith("s3://"):
        raise ValueError(f"{uri!r} is not an s3:// URI")
    bucket, _, prefix = uri[5:].partition("/")
    return bucket, prefix.strip("/")


def set_thread_nice(nice: int) -> None:
    """Lower this thread's CPU priority (Linux: per-thread nice); training keeps the cores it needs."""
    if nice > 0 and hasattr(os, "setpriority"):
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)


def _default_client() -> Any:
    from spotrelay.adapters import aws

    return aws.client("s3")


class S3Tier:
    def __init__(
        self,
        uri: str,
        client: Callable[[], Any] = _default_client,
        part_size: int = 16 * MiB,
        workers: int = 8,
        nice: int = 0,
        max_mb_s: float | None = None,
    ) -> None:
        self.uri = uri.rstrip("/")
        self.bucket, self.prefix = parse_uri(uri)
        self._client_factory = client
        self._client: Any = None
        self._client_lock = threading.Lock()
        self._transfers: Any = None
        self.part_size = part_size
        self.workers = workers
        self.max_bandwidth = int(max_mb_s * 1e6) if max_mb_s else None
        self._pool = ThreadPoolExecutor(
            workers, thread_name_prefix="s3-part", initializer=set_thread_nice, initargs=(nice,)
        )

    @property
    def client(self) -> Any:
        with self._client_lock:  # the periodic and the emergency lane may ask first at the same time
            if self._client is None:
                self._client = self._client_factory()
        return self._client

    def key(self, rel: str) -> str:
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def step_uri(self, step: int) -> str:
        return f"{self.uri}/{step_name(step)}"

    # --- upload --------------------------------------------------------------------------------
    def upload(self, bodies: list[tuple[str | io.IOBase, str]]) -> None:
        """Upload (file name or seekable stream, relative key) pairs, every part in parallel.

        s3transfer's manager does the multipart work (it was faster than our own part loop against
        the same endpoint) and aborts a failed multipart upload.
        """
        futures = [self.transfers.upload(body, self.bucket, self.key(rel)) for body, rel in bodies]
        try:
            for fut in futures:
                fut.result()
        except BaseException:
            for fut in futures:
                fut.cancel()
            raise

    def warm(self) -> None:
        """Build the client and transfer manager and make one request now: botocore loads its
        models and endpoint rules on the first call, which should not be an emergency's."""
        _ = self.transfers
        try:
            self.client.list_objects_v2(Bucket=self.bucket, Prefix=self.key(LATEST), MaxKeys=1)
        except Exception as exc:  # the save that needs S3 will report it properly
            log.warning("S3 tier %s not reachable yet: %s", self.uri, exc)

    @property
    def transfers(self) -> Any:
        client = self.client
        with self._client_lock:  # one manager (thread pools) per tier, however many threads ask first
            if self._transfers is None:
                from boto3.s3.transfer import TransferConfig
                from s3transfer.manager import TransferManager

                config = TransferConfig(
                    multipart_threshold=self.part_size,
                    multipart_chunksize=self.part_size,
                    max_concurrency=self.workers,
                    max_bandwidth=self.max_bandwidth,
                )
                self._transfers = TransferManager(client, config)
        return self._transfers

    def put_text(self, rel: str, text: str) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self.key(rel), Body=text.encode())

    def write_part(self, part: RankPart) -> None:
        self.put_text(f"{step_name(part.step)}/{part_name(part.rank)}", part.model_dump_json())

    def commit(self, manifest: Manifest) -> None:
        self.put_text(f"{step_name(manifest.step)}/{MANIFEST}", manifest.model_dump_json(indent=1))
        current = self.latest()
        if current is None or manifest.step >= current:
            self.put_text(LATEST, step_name(manifest.step) + "\n")

    # --- reading -------------------------------------------------------------------------------
    def absent(self, exc: ClientError, rel: str) -> bool:
        """Whether a failed GetObject of ``rel`` means the object is not there. S3 answers a missing key
        with 403, not 404, to a caller whose ListBucket is conditioned on ``s3:prefix`` (a GetObject
        carries no prefix): the node roles' (spotrelay/adapters/iam_job_profile.py). A listing of exactly
        that key, which the condition allows, tells a missing object from a real denial."""
        code = exc.response.get("Error", {}).get("Code")  # by code: each client has its own exception classes
        if code in ("NoSuchKey", "404"):
            return True
        if code not in ("AccessDenied", "403"):
            return False
        key = self.key(rel)
        found = self.client.list_objects_v2(Bucket=self.bucket, Prefix=key, MaxKeys=1).get("Contents", [])
        return not any(obj.get("Key") == key for obj in found)

    def get_text(self, rel: str) -> str | None:
        try:
            return str(self.client.get_object(Bucket=self.bucket, Key=self.key(rel))["Body"].read().decode())
        except ClientError as exc:
            if self.absent(exc, rel):
                return None
            raise

    def list_keys(self, rel_prefix: str) -> list[str]:
        keys = []
        base = self.key(rel_prefix)
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=base):
            keys += [obj["Key"][len(self.key("")) :] for obj in page.get("Contents", [])]
        return keys

    def latest(self) -> int | None:
        text = self.get_text(LATEST)
        return parse_step(text.strip()) if text else None

    def steps(self) -> list[int]:
        """Steps that have a manifest, newest first."""
        found = set()
        for rel in self.list_keys("step-"):
            folder, _, rest = rel.partition("/")
            step = parse_step(folder)
            if step is not None and rest == MANIFEST:
                found.add(step)
        return sorted(found, reverse=True)

    def manifest(self, step: int) -> Manifest | None:
        source = f"{self.step_uri(step)}/{MANIFEST}"
        rel = f"{step_name(step)}/{MANIFEST}"
        try:  # bounded: a hostile object must not fill memory
            body = self.client.get_object(Bucket=self.bucket, Key=self.key(rel))["Body"]
        except ClientError as exc:
            if self.absent(exc, rel):
                return None
            raise
        return same_step(read_manifest(body.read(MAX_MANIFEST_BYTES + 1), source), step, source)

    def wait_parts(self, step: int, world_size: int, timeout: float, have: RankPart | None = None) -> list[RankPart]:
        """Every rank's part of ``step`` (``have``: this rank's own, already known)."""
        end = time.monotonic() + timeout
        prefix = f"{step_name(step)}/{PARTS_DIR}/"
        while world_size > (1 if have else 0) and len(self.list_keys(prefix)) < world_size:
            if time.monotonic() > end:
                raise TimeoutError(f"{self.step_uri(step)}: not every rank uploaded its part")
            time.sleep(0.05)
        parts = []
        for rank in range(world_size):
            if have is not None and have.rank == rank:
                parts.append(have)
                continue
            text = self.get_text(f"{step_name(step)}/{part_name(rank)}")
            if text is None:
                raise TimeoutError(f"{self.step_uri(step)}: part of rank {rank} is missing")
            parts.append(RankPart.model_validate_json(text))
        return parts

    def wait_manifest(self, step: int, timeout: float) -> None:
        end = time.monotonic() + timeout
        while self.get_text(f"{step_name(step)}/{MANIFEST}") is None:
            if time.monotonic() > end:
                raise TimeoutError(f"{self.step_uri(step)}: no manifest after {timeout:.0f} s")
            time.sleep(0.1)

    def download(self, step: int, manifest: Manifest, dest: Path) -> None:
        """Fetch every shard of a step into ``dest`` in parallel (verification is the caller's)."""
        folder = step_name(step)

        def fetch(rel: str) -> None:
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                self.client.download_file(self.bucket, self.key(f"{folder}/{rel}"), str(target))
            except ClientError as exc:  # a shard that is gone reads as gone (restore falls back), even as 403
                if self.absent(exc, f"{folder}/{rel}"):
                    raise ClientError({"Error": {"Code": "NoSuchKey", "Message": f"{rel} is not there"}},
                                      "GetObject") from exc
                raise

        futures = [self._pool.submit(fetch, shard.path) for shard in manifest.shards]
        try:
            for fut in futures:
                fut.result()
        finally:  # a failed fetch: the others end before the caller removes the staging folder
            for fut in futures:
                fut.cancel()
            concurrent.futures.wait(futures)
        (dest / MANIFEST).write_text(manifest.model_dump_json(indent=1))

    # --- retention -----------------------------------------------------------------------------
    def prune(self, keep: int, protect: set[int] | None = None) -> list[int]:
        """Delete committed steps beyond the newest ``keep`` and abandoned older uploads."""
        committed = self.steps()
        if len(committed) <= keep:
            return []
        oldest_kept, protect = committed[keep - 1], protect or set()
        doomed = []
        for key in self.list_keys("step-"):
            step = parse_step(key.split("/")[0])
            if step is not None and step < oldest_kept and step not in protect:
                doomed.append(key)
        for start in range(0, len(doomed), 1000):
            chunk = [{"Key": self.key(k)} for k in doomed[start : start + 1000]]
            self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": chunk, "Quiet": True})
        removed = sorted({parse_step(k.split("/")[0]) or 0 for k in doomed})
        log.info("pruned S3 checkpoints %s (keep %d)", removed, keep)
        return removed

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._transfers is not None:
            self._transfers.shutdown(cancel=True)
