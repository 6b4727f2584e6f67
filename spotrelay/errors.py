"""One root error, split into retryable and permanent.

Adapters translate AWS error codes into these (``raise ... from exc``). Their class names are the
``errorType`` that Step Functions Retry/Catch match on, so renaming one is a workflow change.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class SpotrelayError(Exception):
    """Root of every error spotrelay raises on purpose."""


class RetryableError(SpotrelayError):
    """The same call may succeed later (throttling, capacity, a lost race worth re-reading)."""


class PermanentError(SpotrelayError):
    """Retrying the same call will fail the same way."""


# --- job store -------------------------------------------------------------------------------
class NotFoundError(PermanentError):
    """The job, node or object does not exist."""


class AlreadyExistsError(PermanentError):
    """A create found the item already there (a redelivered event, usually)."""


class ConflictError(RetryableError):
    """A conditional write lost: the item's status or version moved since it was read."""


class InvalidTransitionError(PermanentError):
    """The status transition is not in the table (a late or out-of-order event)."""


# --- specs -----------------------------------------------------------------------------------
class SpecError(PermanentError):
    """A job spec is invalid; ``errors`` lists (field path, message) pairs."""

    def __init__(self, source: str, errors: list[tuple[str, str]]) -> None:
        self.source = source
        self.errors = errors
        lines = "; ".join(f"{path}: {msg}" for path, msg in errors)
        super().__init__(f"{source}: {lines}")


class SpecFileError(SpecError):
    """The spec file itself cannot be read as text (missing, a folder, no permission, too large, not
    UTF-8): one cause and no field, so the CLI says it in one line (the handler records it as a SpecError)."""

    def __init__(self, source: str, cause: str) -> None:
        self.cause = cause
        super().__init__(source, [("(file)", cause)])


class CodeArchiveError(PermanentError):
    """The job's code cannot be packed, fetched or unpacked safely (entrypoint.code)."""


# --- capacity and placement ------------------------------------------------------------------
class InsufficientCapacityError(RetryableError):
    """EC2 had no capacity for the pool (InsufficientInstanceCapacity, partial fleet)."""


class QuotaExceededError(RetryableError):
    """An account limit (vCPU quota, MaxSpotInstanceCountExceeded) blocked the launch."""


class NoPlacementError(PermanentError):
    """No candidate pool is left for the job (all excluded, too expensive or cooling down)."""


class RetryBudgetExhaustedError(PermanentError):
    """The job used every recovery (or user restart) its spec allows."""


class BudgetExceededError(PermanentError):
    """The job's cost reached its budget."""


# --- checkpoints -----------------------------------------------------------------------------
class CheckpointError(SpotrelayError):
    """Root for checkpoint problems."""


class CorruptCheckpointError(CheckpointError, PermanentError):
    """A shard is missing, has the wrong size or checksum, or the manifest is unreadable."""


class CheckpointUnavailableError(RetryableError):
    """A committed checkpoint could not be read for a reason that may pass (S3 unreachable, throttled,
    a download broken off): resume does not start over beside it. Not a CheckpointError: that is a
    refusal, never retried; this one ends the attempt as an infrastructure failure (exit INFRA_ERROR)."""


class UnsafeCheckpointError(CheckpointError, PermanentError):
    """A checkpoint file would execute code when loaded (a pickle with globals)."""


class IncompatibleCheckpointError(CheckpointError, PermanentError):
    """A valid checkpoint this run cannot use: another engine, another model, another spec or layout."""


class CheckpointFormatError(IncompatibleCheckpointError):
    """A manifest of a newer format than this version reads: refused (upgrade), never skipped for an older one."""


class BatchPlanError(PermanentError):
    """The global batch cannot be split over this world size and micro-batch."""


# --- node agent ------------------------------------------------------------------------------
class ImdsUnavailableError(RetryableError):
    """The instance metadata service did not answer (timeouts, refused, 5xx) after retries."""


class AgentConfigError(PermanentError):
    """The agent was not told what it needs (job id, rank, ...) by user data, tags or environment."""


# --- workflow signals ------------------------------------------------------------------------
class JobCancelledError(PermanentError):
    """A user cancelled the job; task-token waits fail with this so the workflow tears down."""


class MoveCancelledError(PermanentError):
    """A review's move was overtaken: the attempt ended or changed before the new gang launched.
    The workflow waits for the outcome again; nothing was launched."""


# --- other processes -------------------------------------------------------------------------
class RemoteBug(Exception):
    """An unexpected exception in another process (a simulation worker), carried back as its type's name
    and message, not pickled: the CLI says it as it says that exception in its own process, a bug. Its
    traceback there is a note, which SPOTRELAY_DEBUG=1 shows."""

    def __init__(self, kind: str, message: str, traceback: str = "") -> None:
        super().__init__(message)
        self.kind = kind
        if traceback:
            self.add_note(f"in the other process:\n{traceback.rstrip()}")


def validation_message(err: Mapping[str, Any]) -> str:
    """One pydantic error's message, without the "Value error, " pydantic puts before a validator's own."""
    return str(err["msg"]).removeprefix("Value error, ")
