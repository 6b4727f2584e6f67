"""Pick the checkpoint to resume from: the newest valid manifest in either tier.

A step is a candidate once its manifest exists (in the local tier or in S3). The local copy is
verified first (sizes and sha256); if it is missing, partial or corrupt, the S3 copy is
downloaded into a staging folder, verified, then moved into place. A candidate that fails is
logged with the reason and the previous one is tried; a manifest of a newer format than this
version reads is not a failure of that candidate but of this version: it is raised, never passed over.

When there are committed checkpoints and none of them can be used, resume does not start over from
step 0 beside them (that silently threw a run's progress away, and retention then kept the bad ones
and pruned the new): a failure that may pass (S3 unreachable or throttled, a download broken off, the
listing or a manifest unreadable) raises CheckpointUnavailableError, which ends the attempt as an
infrastructure failure to be retried; when every one is corrupt (a checksum or size that does not
match, a missing shard) CorruptCheckpointError is raised: a refusal naming each, and the job fails.
Only a job with no committed checkpoint starts from scratch.
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
from spotrelay.errors import CheckpointFormatError, CheckpointUnavailableError, CorruptCheckpointError

log = logging.getLogger("spotrelay.checkpoint")
_MISSING = ("NoSuchKey", "404", "NotFound")  # S3 error codes of an object that is not there
# what a proposer shares instead of a step: (kind, message), every rank raises the same error
Refusal = tuple[str, str]
_RAISE: dict[str, type[Exception]] = {"format": CheckpointFormatError, "corrupt": CorruptCheckpointError,
                                      "unavailable": CheckpointUnavailableError}


def candidates(local: LocalTier, s3: S3Tier | None, before: int | None = None) -> list[int]:
    found = set(local.steps())
    if s3 is not None:
        try:
            found |= set(s3.steps())
        except Exception as exc:  # S3 may hold newer steps than this node: not knowing is not "none"
            raise CheckpointUnavailableError(f"{s3.uri}: could not list the checkpoints ({exc})") from exc
    return sorted((s for s in found if before is None or s < before), reverse=True)


def _missing(exc: BaseException) -> bool:
    """An S3 error that says the object is not there (a deleted or never-written shard)."""
    response = getattr(exc, "response", None)
    return isinstance(response, dict) and str(response.get("Error", {}).get("Code")) in _MISSING


def materialize(step: int, local: LocalTier, s3: S3Tier | None) -> Manifest:
    """Make a verified, complete copy of ``step`` in the local tier; return its manifest.
    CorruptCheckpointError when no copy of it can ever be used; CheckpointUnavailableError when the
    S3 copy could not be read now (and the local one, if any, is not usable)."""
    reasons, passing = [], False
    if (local.step_dir(step) / "manifest.json").is_file():
        try:
            return local.verified(step)
        except CorruptCheckpointError as exc:
            reasons.append(f"local: {exc}")
    if s3 is not None:
        try:
            return _download(step, local, s3)
        except CheckpointUnavailableError as exc:
            reasons.append(f"s3: {exc}")
            passing = True
        except CorruptCheckpointError as exc:
            reasons.append(f"s3: {exc}")
    else:
        reasons.append("no S3 tier configured")
    error = CheckpointUnavailableError if passing else CorruptCheckpointError
    raise error(f"{step_name(step)} unusable: " + "; ".join(reasons))


def _download(step: int, local: LocalTier, s3: S3Tier) -> Manifest:
    try:
        manifest = s3.manifest(step)
    except (CheckpointFormatError, CorruptCheckpointError):
        raise
    except Exception as exc:  # a missing manifest is None; anything else may pass
        raise CheckpointUnavailableError(f"{s3.step_uri(step)}/manifest.json could not be read ({exc})") from exc
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
    except Exception as exc:  # a missing shard: never usable; a broken connection or throttling may pass
        shutil.rmtree(staging, ignore_errors=True)
        if _missing(exc):
            raise CorruptCheckpointError(f"{s3.step_uri(step)}: a shard is missing ({exc})") from exc
        raise CheckpointUnavailableError(f"{s3.step_uri(step)}: download failed ({exc})") from exc
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
    """The newest usable checkpoint (older than step ``before``), made local and verified; None when
    there is no committed one. When there are and none can be used: CheckpointUnavailableError if a
    failure may pass, else CorruptCheckpointError naming each (never a fresh start beside them)."""
    passing: list[str] = []  # failures that may pass
    corrupt: list[str] = []
    for step in candidates(local, s3, before):
        try:
            return materialize(step, local, s3)
        except (CheckpointUnavailableError, CorruptCheckpointError) as exc:
            log.warning("skipping checkpoint, falling back to the previous one: %s", exc)
            (passing if isinstance(exc, CheckpointUnavailableError) else corrupt).append(str(exc))
    if passing:
        raise CheckpointUnavailableError(
            "no checkpoint could be read now, so the run does not start over from step 0 beside them: "
            + "; ".join(passing + corrupt))
    if corrupt:
        raise CorruptCheckpointError(
            f"every checkpoint is unusable ({len(corrupt)}), so the run does not start over from step 0 beside "
            "them: " + "; ".join(corrupt) + "; move them away to start from scratch")
    return None


def agree_on_step(
    proposer: bool,
    fetch_here: bool,
    local: LocalTier,
    s3: S3Tier | None,
    before: int | None,
    share: Callable[[int | Refusal | None], int | Refusal | None],
    every: Callable[[bool], bool],
) -> int | None:
    """The newest checkpoint every node can use. The proposer (rank 0) picks its newest valid one,
    ``share`` hands it to every rank, each node that must fetch it (``fetch_here``) does and verifies
    it, and ``every`` (all ranks' flags) passes over a step any node could not use for the one
    before it. The proposer verifies only its own copy: a shard that another node then finds
    corrupt or cannot download used to fail that rank alone (exit 1, a user error). What the
    proposer's choice raises (a manifest of a newer format, every checkpoint unusable or unreadable
    now) is raised on every rank, never passed over: ``share`` hands out (kind, message) instead of a
    step. Once a step was passed over, running out of older ones is not a fresh start either: every
    rank raises CheckpointUnavailableError if any node's failure may pass, else CorruptCheckpointError."""
    fell_back, passing = False, False
    reasons: list[str] = []  # this node's failures, in order
    while True:
        proposal: int | Refusal | None = None
        if proposer:
            try:
                chosen = choose(local, s3, before=before)
                proposal = chosen.step if chosen else None
            except CheckpointFormatError as exc:
                proposal = ("format", str(exc))
            except CheckpointUnavailableError as exc:
                proposal = ("unavailable", str(exc))
            except CorruptCheckpointError as exc:
                proposal = ("corrupt", str(exc))
        step = share(proposal)
        if isinstance(step, tuple):
            raise _RAISE[step[0]](step[1])
        if step is None:
            if not fell_back:
                return None
            # (every rank is here: the proposer shared None) one more collective, on every rank alike
            error = CorruptCheckpointError if every(not passing) else CheckpointUnavailableError
            raise error("no checkpoint every node can use, so the run does not start over from step 0 beside "
                        "them: " + ("; ".join(reasons) or "another node could not use them"))
        usable, newer = True, ""
        if fetch_here:
            try:
                materialize(step, local, s3)
            except CheckpointFormatError as exc:
                usable, newer = False, str(exc)
            except (CheckpointUnavailableError, CorruptCheckpointError) as exc:
                log.warning("skipping checkpoint, falling back to the previous one: %s", exc)
                usable, passing = False, passing or isinstance(exc, CheckpointUnavailableError)
                reasons.append(str(exc))
        if every(usable):
            return step
        if not every(not newer):  # only after a failure: one more collective, on every rank alike
            where = f"{s3.step_uri(step)}/manifest.json" if s3 is not None else step_name(step)
            raise CheckpointFormatError(newer or f"{where}: another node read this manifest in a newer format than "
                                        "this spotrelay reads; upgrade spotrelay to resume it")  # fmt: skip
        before, fell_back = step, True
