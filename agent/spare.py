"""A hot spare (``resources.spares``): booted with the gang, out of training. It keeps the job's
newest committed checkpoint in its local tier, so when recover promotes it to a lost rank (a node
record for it in the next attempt with a RESTART directive) it restores without a download. A
replacement does the same beside its own start-up (:class:`Prefetch`).

Detect (a newer manifest in S3, a record that adopts this instance) and act (copy the step into the
local tier) are kept apart: :class:`SpareCache` only mirrors; the daemon's stand-by loop decides.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from agent.checkpoint.local_tier import LocalTier
from agent.checkpoint.restore import materialize
from agent.checkpoint.s3_tier import S3Tier
from spotrelay.contracts.agent import NodeView, draining_ranks
from spotrelay.contracts.control import read_events
from spotrelay.errors import CheckpointFormatError, CorruptCheckpointError

log = logging.getLogger("spotrelay.agent")
__all__ = ["Prefetch", "SpareCache", "StandBy", "draining_ranks", "wait_for_drain"]


class SpareCache:
    """Mirrors the newest committed step from S3 into this node's local tier (keeps ``keep``)."""

    def __init__(self, local_dir: Path, uri: str | None, keep: int = 2, s3: S3Tier | None = None) -> None:
        self.local = LocalTier(local_dir)
        self.s3 = s3 if s3 is not None else (S3Tier(uri) if uri else None)
        self.keep = max(1, keep)
        self.cached: int | None = max(self.local.steps(), default=None)

    def refresh(self) -> int | None:
        """Copy the newest committed step if it is newer than the local one; returns the local newest."""
        if self.s3 is None:
            return self.cached
        newest = self.s3.latest()
        if newest is None or (self.cached is not None and newest <= self.cached):
            return self.cached
        try:
            materialize(newest, self.local, self.s3)
        except CorruptCheckpointError as exc:  # a step being pruned or still uploading: next poll
            log.info("spare could not mirror step %s: %s", newest, exc)
            return self.cached
        except CheckpointFormatError as exc:  # the trainer refuses it on resume; nothing to mirror
            log.info("spare will not mirror step %s: %s", newest, exc)
            return self.cached
        self.cached = newest
        self.local.prune(self.keep, protect={newest})
        log.info("spare holds step %s locally", newest)
        return newest


class Prefetch:
    """A replacement's local tier filled beside its start-up: from the agent's start until its
    trainer has resumed (or ``limit_s``), mirror the newest committed step (the notice's final save
    once it lands), so the restore reads it locally instead of downloading it after the imports."""

    def __init__(self, cache: Callable[[], SpareCache], control_dir: Path, every_s: float = 1.0,
                 limit_s: float = 900.0) -> None:
        self.cache, self.control_dir, self.every_s, self.limit_s = cache, control_dir, every_s, limit_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="prefetch", daemon=True)

    def start(self) -> Prefetch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        started = time.time()
        _, offset = read_events(self.control_dir)  # earlier runs' events are old news
        try:
            cache = self.cache()
        except Exception as exc:  # no S3 tier to mirror from: the trainer restores as it would anyway
            log.warning("no prefetch: %s", exc)
            return
        while not self._stop.is_set() and time.time() - started < self.limit_s:
            try:
                cache.refresh()
            except Exception as exc:  # S3 unreachable for a while: the trainer downloads what it needs
                log.warning("prefetch could not mirror the newest checkpoint: %s", exc)
            events, offset = read_events(self.control_dir, offset)
            if any(e.kind == "resumed" for e in events):
                return
            self._stop.wait(self.every_s)


class StandBy:
    """One poll of a spare on the bench: still wanted (``alive``), then mirror the newest step."""

    def __init__(self, cache: SpareCache, alive: Callable[[], bool]) -> None:
        self.cache, self.alive = cache, alive

    def tick(self) -> bool:
        if not self.alive():
            return False
        try:
            self.cache.refresh()
        except Exception as exc:  # S3 unreachable for a while: the next poll tries again
            log.warning("spare could not refresh its checkpoint: %s", exc)
        return True


def wait_for_drain(read_nodes: Callable[[], list[NodeView]], attempt: int, clock: Callable[[], float],
                   sleep: Callable[[float], None], stopping: Callable[[], bool]) -> None:
    """Replacements launched during a notice wait here, before the rendezvous, until the ranks they
    replace committed their emergency save and exited: training then restores the newest step."""
    logged = False
    while not stopping():
        ranks = draining_ranks(read_nodes(), attempt, clock())
        if not ranks:
            return
        if not logged:
            log.info("waiting for the previous gang's emergency save (ranks %s)", ranks)
            logged = True
        sleep(1.0)
