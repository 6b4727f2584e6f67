"""Fetch the job's code before launch: ``entrypoint.code`` names an s3:// .tar.gz archive (packed by
``spotrelay submit`` or by hand); it is downloaded, hash-checked and unpacked into the node's work
directory (``spotrelay/code/unpack.py``), and the launch runs in it (``working_dir`` is relative
to the unpacked code). A missing, unreadable, tampered or unsafe archive is the user's error: the
attempt ends with USER_ERROR and the reason, and no rank starts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from agent.launcher import LaunchPlan, Rendezvous
from spotrelay.code.pack import MAX_PACKED_BYTES
from spotrelay.code.unpack import MARKER, unpack
from spotrelay.contracts.exit_codes import ExitCode
from spotrelay.errors import CodeArchiveError
from spotrelay.spec.checks import CONTENT_ADDRESSED
from spotrelay.spec.models import Entrypoint, JobSpec

PlanBuilder = Callable[[JobSpec, Rendezvous, dict[str, str], str | None, str], LaunchPlan]
_NOT_THERE = ("404", "NoSuchKey", "NotFound", "403", "AccessDenied", "NoSuchBucket")


def expected_sha256(entry: Entrypoint) -> str | None:
    named = CONTENT_ADDRESSED.search(entry.code or "")
    return entry.code_sha256 or (named.group(1) if named else None)


def fetch(entry: Entrypoint, work_dir: Path) -> Path:
    """The unpacked code directory for ``entry.code`` under ``work_dir``."""
    from spotrelay.adapters.aws import client, error_code

    uri = entry.code or ""
    if not uri.startswith("s3://"):
        raise CodeArchiveError(f"entrypoint.code {uri!r} is not an s3:// archive")
    dest, sha = work_dir / "code", expected_sha256(entry)
    if sha is not None and (dest / MARKER).is_file() and (dest / MARKER).read_text().strip() == sha:
        return dest  # a survivor of an earlier attempt keeps its copy
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    archive = work_dir / "code.tar.gz"
    work_dir.mkdir(parents=True, exist_ok=True)
    try:
        size = int(client("s3").head_object(Bucket=bucket, Key=key)["ContentLength"])
        if size > MAX_PACKED_BYTES:
            raise CodeArchiveError(f"{uri} is {size} bytes; the limit is {MAX_PACKED_BYTES}")
        client("s3").download_file(bucket, key, str(archive))
    except CodeArchiveError:
        raise
    except Exception as exc:
        if error_code(exc) in _NOT_THERE:
            raise CodeArchiveError(f"{uri} cannot be read ({error_code(exc)}); check entrypoint.code") from exc
        raise  # the network or S3 itself: infrastructure, not the user's code
    try:
        return unpack(archive, dest, sha)
    finally:
        archive.unlink(missing_ok=True)


class _Launches(Protocol):
    plan_builder: PlanBuilder


class _Reports(Protocol):
    def training_exited(self, exit_code: int, reason: str, last_step: int | None,
                        last_committed_step: int | None, output_tail: str = "") -> bool: ...


def prepare(agent: _Launches, spec: JobSpec, work_dir: Path, reporter: _Reports) -> int | None:
    """Fetch the code and point the agent's launches into it; USER_ERROR (reported, with the
    cause) when the archive is unusable, None when the agent may go on."""
    if not spec.entrypoint.code:
        return None
    try:
        agent.plan_builder = in_code_dir(agent.plan_builder, fetch(spec.entrypoint, work_dir))
    except CodeArchiveError as exc:  # the user's archive: a user error, with the cause, and no rank starts
        reporter.training_exited(ExitCode.USER_ERROR, f"user-error: {exc}", None, None, str(exc))
        return int(ExitCode.USER_ERROR)
    return None


def in_code_dir(builder: PlanBuilder, code_dir: Path) -> PlanBuilder:
    """A plan builder whose launch runs inside the unpacked code."""

    def build(spec: JobSpec, rdzv: Rendezvous, env: dict[str, str], itype: str | None, python: str) -> LaunchPlan:
        plan = builder(spec, rdzv, env, itype, python)
        return dataclasses.replace(plan, cwd=str(code_dir / plan.cwd))

    return build
