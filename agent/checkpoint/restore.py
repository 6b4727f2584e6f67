"""Pick the checkpoint to resume from: the newest valid manifest in either tier.

A step is a candidate once its manifest exists (in the local tier or in S3). The local copy is
verified first (sizes and sha256); if it is missing, partial or corrupt, the S3 copy is
downloaded into a staging folder, verified, then moved into place. A candidate that fails is
logged with the reason and the previous one is tried; a manifest of a newer format than this
version reads is not a failure of that candidate but of this version: it is raised, never passed over.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from collections.abc import Callable

from agent.checkpoint.local_tier import LocalTier
from agent.checkpoint.manifest import Manifest, step_name, verify
from agent.checkpoint.s3_tier import S3Tier
from spotrelay.errors import CheckpointFormatError, CorruptCheckpointError

log = logging.getLogger("spotrelay.checkpoint")


def candidates(local: LocalTier, s3: S3Tier | None, before: int | None = None) -> list[int]:
    found = set(local.steps())
    if s3 is not None:
        found |= set(s3.steps())
    return sorted((s for s in found if before is None or s < before), reverse=True)


def materialize(step: int, local: LocalTier, s3: S3Tier | None) -> Manifest:
    """Make a verified, complete copy of ``step`` in the local tier; return its manifest."""
    reasons = []
    if (local.step_dir(step) / "manifest.json").is_file():
        try:
            return local.verified(step)
        except CorruptCheckpointError as exc:
            reasons.append(f"local: {exc}")
    if s3 is not None:
        try:
            return _download(step, local, s3)
        except CorruptCheckpointError as exc:
            reasons.append(f"s3: {exc}")
    else:
        reasons.append("no S3 tier configured")
    raise CorruptCheckpointError(f"{step_name(step)} unusable: " + "; ".join(reasons))


def _download(step: int, local: LocalTier, s3: S3Tier) -> Manifest:
    manifest = s3.manifest(step)
    if manifest is None:
        raise CorruptCheckpointError(f"{s3.step_uri(step)} has no manifest")
    if not manifest.complete:
        raise CorruptCheckpointError(f"{s3.step_uri(step)} lists ranks {manifest.ranks} only")
    # one staging folder per downloader: a node's prefetch (agent/spare.py) and its trainer may fetch
    # the same step at once
    staging = local.root / f".download-{step_name(step)}-{os.getpid()}-{threading.get_ident()}"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        s3.download(step, manifest, staging)
    except Exception as exc:  # a missing object or a broken connection both mean "not this one"
        shutil.rmtree(staging, ignore_errors=True)
        raise CorruptCheckpointError(f"{s3.step_uri(step)}: download failed ({exc})") from exc
    try:
        verify(staging, manifest)
    except CorruptCheckpointError:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    target = local.step_dir(step)
    if (target / "manifest.json").is_file():  # the other downloader finished first: keep its copy
        try:
            found = local.verified(step)
        except CorruptCheckpointError:
            pass
        else:
            shutil.rmtree(staging, ignore_errors=True)
            return found
    shutil.rmtree(target, ignore_errors=True)
    os.replace(staging, target)
    log.info("downloaded %s from %s (%d bytes)", step_name(step), s3.step_uri(step), manifest.total_bytes)
    return manifest


def choose(local: LocalTier, s3: S3Tier | None, before: int | None = None) -> Manifest | None:
    """The newest usable checkpoint (older than step ``before``), made local and verified; None when there is none."""
    for step in candidates(local, s3, before):
        try:
            return materialize(step, local, s3)
        except CorruptCheckpointError as exc:
            log.warning("skipping checkpoint, falling back to the previous one: %s", exc)
    return None


def agree_on_step(
    proposer: bool,
    fetch_here: bool,
    local: LocalTier,
    s3: S3Tier | None,
    before: int | None,
    share: Callable[[int | str | None], int | str | None],
    every: Callable[[bool], bool],
) -> int | None:
    """The newest checkpoint every node can use. The proposer (rank 0) picks its newest valid one,
    ``share`` hands it to every rank, each node that must fetch it (``fetch_here``) does and verifies
    it, and ``every`` (all ranks' flags) passes over a step any node could not use for the one
    before it. The proposer verifies only its own copy: a shard that another node then finds
    corrupt or cannot download used to fail that rank alone (exit 1, a user error). A manifest of a
    newer format (CheckpointFormatError) is raised on every rank, never passed over: the message is
    what ``share`` hands out instead of a step."""
    while True:
        proposal: int | str | None = None
        if proposer:
            try:
                chosen = choose(local, s3, before=before)
                proposal = chosen.step if chosen else None
            except CheckpointFormatError as exc:
                proposal = str(exc)
        step = share(proposal)
        if isinstance(step, str):
            raise CheckpointFormatError(step)
        if step is None:
            return None
        usable, newer = True, ""
        if fetch_here:
            try:
                materialize(step, local, s3)
            except CheckpointFormatError as exc:
                usable, newer = False, str(exc)
            except CorruptCheckpointError as exc:
                log.warning("skipping checkpoint, falling back to the previous one: %s", exc)
                usable = False
        if every(usable):
            return step
        if not every(not newer):  # only after a failure: one more collective, on every rank alike
            where = f"{s3.step_uri(step)}/manifest.json" if s3 is not None else step_name(step)
            raise CheckpointFormatError(newer or f"{where}: another node read this manifest in a newer format than "
                                        "this spotrelay reads; upgrade spotrelay to resume it")  # fmt: skip
        before = step
