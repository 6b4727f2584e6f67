"""The chaos campaign's faults (docs/chaos.md): each one acts on the running twin the way the real
thing would reach production, through the same boundary (EC2 capacity and events, a node's
processes, S3 on the wire and at rest, the controller's event delivery, its store, its schedule).

A fault returns what it hit (a :class:`Hit`) or None when it found nothing to act on right now (the
campaign then draws again later). Randomness comes from the campaign's seeded ``random.Random``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spotrelay.local.compute import LocalInstance, _descendants
from spotrelay.local.market import CapacityRule
from spotrelay.local.twin import Twin

log = logging.getLogger(__name__)

# Faults that end the attempt they hit (downtime is measured for these).
NODE_FAULTS = ("spot-notice", "kill", "agent-kill", "trainer-crash")
KINDS = (
    *NODE_FAULTS,
    "rebalance-storm",  # rebalance recommendations for every live node, twice
    "ec2-duplicate",  # an EC2 event delivered again
    "ec2-late",  # an old EC2 event (another attempt's) delivered now, out of order
    "s3-corrupt",  # a committed checkpoint shard overwritten with garbage
    "s3-delete",  # a committed checkpoint shard deleted
    "s3-errors",  # the nodes' next S3 connections answered 503 SlowDown / 500 InternalError
    "s3-drop",  # the nodes' open S3 connections reset mid-transfer
    "capacity",  # every pool out of capacity for a while (CAPACITY_OUTAGE_S)
    "handler-crash",  # the next handler calls fail after their writes (SQS redelivers them)
    "write-conflict",  # bursts of concurrent writes to a job (its handlers' conditional writes lose)
    "reconcile-late",  # the reconcile schedule stops for a while
)

# How long a `capacity` fault lasts, in wall seconds: 3-13 minutes at the campaign's cooldown scale
# (0.05), 17-67 at its boot scale (0.01). A time, not a count of refused launches: counted, outages
# drawn close together piled up (run 7 of docs/chaos.md: 22 refusals pending) and the pools' cooldowns,
# doubling with each refusal, stretched them past the campaign's 30-minute bound.
CAPACITY_OUTAGE_S = (10.0, 40.0)


def _cmdline(pid: int) -> bytes:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes()
    except OSError:
        return b""


def _children(pid: int) -> list[int]:
    direct = set()
    for child in _descendants(pid):
        try:
            stat = (Path("/proc") / str(child) / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            direct.add(child)
    return sorted(direct)


@dataclass
class Hit:
    kind: str
    time: float
    job_id: str | None = None
    node: str | None = None  # a<attempt>-r<rank>
    attempt: int | None = None
    step: int | None = None
    detail: str = ""


@dataclass
class Injector:
    twin: Twin
    rng: random.Random
    corrupted: dict[str, set[int]] = field(default_factory=dict)  # job id -> checkpoint steps we broke
    orphans: list[tuple[LocalInstance, list[int]]] = field(default_factory=list)  # trainers of killed agents
    _crashes_left: int = 0
    _reconcile_paused_until: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def install(self) -> None:
        """Hook the delivery and the schedule (in-process seams of the twin, nothing in production)."""
        dispatcher, ticker = self.twin.dispatcher, self.twin.ticker
        assert dispatcher is not None
        invoke = dispatcher.invoke

        def crashing_invoke(function: str, event: dict[str, Any]) -> Any:
            delivery = invoke(function, event)
            with self._lock:
                crash = self._crashes_left > 0 and delivery.error is None and "reconcile" not in function
                self._crashes_left -= 1 if crash else 0
            if crash:  # the handler's writes happened; its caller sees a failure and delivers again
                delivery = type(delivery)(delivery.time, delivery.function, delivery.detail_type, delivery.detail,
                                          "InjectedCrashAfterWrite", delivery.result)
            return delivery

        dispatcher.invoke = crashing_invoke  # type: ignore[method-assign]
        if ticker is not None:
            tick = ticker.fn
            ticker.fn = lambda: None if time.time() < self._reconcile_paused_until else tick()

    # --- targets --------------------------------------------------------------------------------
    def _training(self, job_ids: set[str]) -> list[LocalInstance]:
        assert self.twin.compute is not None
        return [li for li in self.twin.compute.instances()
                if li.alive and li.booted_at is not None and li.notice_at is None and li.instance.job_id in job_ids
                and (li.work_dir / "control" / "progress.json").exists()]

    def _hit(self, kind: str, li: LocalInstance | None = None, detail: str = "", job_id: str | None = None) -> Hit:
        from spotrelay.local.chaos import node_step

        if li is None:
            return Hit(kind, time.time(), job_id, detail=detail)
        i = li.instance
        return Hit(kind, time.time(), i.job_id, f"a{i.attempt}-r{i.rank}", i.attempt, node_step(li), detail)

    # --- the faults -----------------------------------------------------------------------------
    def fire(self, kind: str, job_ids: set[str]) -> Hit | None:
        compute = self.twin.compute
        assert compute is not None
        if kind in NODE_FAULTS or kind == "rebalance-storm":
            nodes = self._training(job_ids)
            if not nodes:
                return None
            li = self.rng.choice(nodes)
            if kind == "spot-notice":
                compute.interrupt(li.instance.instance_id)
            elif kind == "kill":
                compute.kill(li.instance.instance_id)
            elif kind == "agent-kill":
                return self._kill_agent(li)
            elif kind == "trainer-crash":
                return self._crash_trainer(li)
            else:
                for _ in range(2):
                    for each in nodes:
                        each.imds.set_rebalance(time.time())
                        self.twin.bus.rebalance_recommendation(each.instance)
                return self._hit(kind, li, f"{len(nodes)} nodes")
            return self._hit(kind, li)
        if kind in ("ec2-duplicate", "ec2-late"):
            return self._replay(kind)
        if kind in ("s3-corrupt", "s3-delete"):
            return self._break_shard(kind, job_ids)
        if kind == "s3-errors":
            assert self.twin.throttle is not None, "the campaign's twin runs the S3 proxy"
            for _ in range(self.rng.randint(2, 6)):
                self.twin.throttle.faults.add(self.rng.choice(["SlowDown", "InternalError"]), 1)
            return self._hit(kind)
        if kind == "s3-drop":
            assert self.twin.throttle is not None
            dropped = self.twin.throttle.drop_connections()
            return self._hit(kind, detail=f"{dropped} connections") if dropped else None  # none open: no fault
        if kind == "capacity":
            seconds = self.rng.uniform(*CAPACITY_OUTAGE_S)
            self.twin.market.capacity.append(CapacityRule("*", until=time.monotonic() + seconds))
            return self._hit(kind, detail=f"every pool for {seconds:.0f} s")
        if kind == "handler-crash":
            with self._lock:
                self._crashes_left += self.rng.randint(1, 4)
            return self._hit(kind)
        if kind == "write-conflict":
            return self._conflicts(job_ids)
        if kind == "reconcile-late":
            self._reconcile_paused_until = time.time() + self.rng.uniform(10, 30)
            return self._hit(kind)
        raise ValueError(f"unknown fault kind {kind!r}; known: {', '.join(KINDS)}")

    def _kill_agent(self, li: LocalInstance) -> Hit | None:
        """SIGKILL the agent alone: training (and any upload it runs) goes on without it."""
        if li.process is None or li.process.poll() is not None:
            return None
        trainers = _descendants(li.process.pid)
        os.kill(li.process.pid, signal.SIGKILL)
        self.orphans.append((li, trainers))
        return self._hit("agent-kill", li, f"{len(trainers)} trainer processes left running")

    def _crash_trainer(self, li: LocalInstance) -> Hit | None:
        """SIGKILL one training worker: a process the launcher (torchrun) started itself, not a
        helper the trainer spawned (a checkpoint uploader's death is another fault)."""
        if li.process is None:
            return None
        launchers = [p for p in _descendants(li.process.pid) if b"torch.distributed.run" in _cmdline(p)]
        workers = [w for p in launchers for w in _children(p)]
        if not workers:
            return None
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.rng.choice(workers), signal.SIGKILL)
        return self._hit("trainer-crash", li)

    def reap(self, everything: bool = False) -> None:
        """Kill the trainers a killed agent left, once their instance is gone (EC2 would)."""
        for li, pids in list(self.orphans):
            if everything or not li.alive:
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
                self.orphans.remove((li, pids))

    def _replay(self, kind: str) -> Hit | None:
        sent = list(self.twin.bus.sent)
        if not sent:
            return None
        _, detail_type, detail = sent[-1] if kind == "ec2-duplicate" else self.rng.choice(sent)
        assert self.twin.compute is not None
        iid = str(detail.get("instance-id"))
        inst = next((li.instance for li in self.twin.compute.instances() if li.instance.instance_id == iid), None)
        if inst is None:
            return None
        self.twin.bus._put(inst, detail_type, dict(detail))
        return Hit(kind, time.time(), inst.job_id, f"a{inst.attempt}-r{inst.rank}", inst.attempt,
                   detail=f"{detail_type} {detail.get('state', '')}".strip())

    def _break_shard(self, kind: str, job_ids: set[str]) -> Hit | None:
        """Corrupt or delete one shard of a job's newest committed checkpoint in S3 (not the manifest:
        resume must notice the bad shard by its checksum or its absence and fall back to the one before)."""
        from spotrelay.adapters.aws import client
        from spotrelay.settings import settings

        s3, bucket = client("s3"), settings().bucket
        for job_id in self.rng.sample(sorted(job_ids), len(job_ids)):
            keys = [o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(
                Bucket=bucket, Prefix=f"checkpoints/{job_id}/") for o in page.get("Contents", [])]
            # committed steps (a manifest); one with an older committed step beside it, so that a fallback
            # exists: with every checkpoint broken resume refuses (the job fails, as it should), which
            # measures nothing about recovery
            committed = sorted({k.split("/")[2] for k in keys
                                if k.split("/")[2].startswith("step-") and k.endswith("/manifest.json")})
            if len(committed) < 2:
                continue
            newest = committed[-1]
            shards = [k for k in keys if k.split("/")[2] == newest and not k.endswith("manifest.json")]
            if not shards:
                continue
            key = self.rng.choice(shards)
            if kind == "s3-corrupt":
                s3.put_object(Bucket=bucket, Key=key, Body=os.urandom(256))
            else:
                s3.delete_object(Bucket=bucket, Key=key)
            self.corrupted.setdefault(job_id, set()).add(int(newest.removeprefix("step-")))
            return Hit(kind, time.time(), job_id, detail=key)
        return None

    def _conflicts(self, job_ids: set[str]) -> Hit | None:
        """A burst of writes to one job that change nothing but its version: every handler writing
        the job meanwhile loses its conditional write and must re-read and retry."""
        from spotrelay.adapters.dynamodb_job_store import DynamoDBJobStore

        if not job_ids:
            return None
        job_id = self.rng.choice(sorted(job_ids))
        store = DynamoDBJobStore()

        def burst() -> None:
            for _ in range(20):
                with contextlib.suppress(Exception):
                    store.update_job(job_id, lambda j: j.model_copy())
                time.sleep(0.1)

        threading.Thread(target=burst, daemon=True, name="write-conflicts").start()
        return self._hit("write-conflict", job_id=job_id, detail="20 writes in 2 s")
