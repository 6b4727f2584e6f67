"""Job status and its one transition table (DESIGN.md section 2; diagram in docs/job-lifecycle.md)."""

from __future__ import annotations

from enum import StrEnum

from spotrelay.errors import InvalidTransitionError


class JobStatus(StrEnum):
    SUBMITTED = "SUBMITTED"
    """The config was dropped into S3; nothing has been checked yet."""
    VALIDATED = "VALIDATED"
    """The spec parsed and validated; the job-run execution is being started."""
    REJECTED = "REJECTED"
    """Terminal. The spec was invalid; the reasons name each bad field."""
    PLACING = "PLACING"
    """The workflow is scoring pools and choosing where to launch this attempt."""
    PROVISIONING = "PROVISIONING"
    """A gang launch (CreateFleet) is in flight for the chosen pool."""
    STARTING = "STARTING"
    """Instances exist; waiting for every agent to report NodeReady."""
    RUNNING = "RUNNING"
    """All ranks are training."""
    CHECKPOINTING = "CHECKPOINTING"
    """An interruption was announced; every rank is flushing a checkpoint at one step."""
    RECOVERING = "RECOVERING"
    """The attempt ended early (interruption, node loss, retryable user error); a new one follows."""
    SUCCEEDED = "SUCCEEDED"
    """Terminal. Training exited 0 on every rank and the cluster was torn down."""
    FAILED = "FAILED"
    """Terminal. Retry budget spent, a user error beyond the restart policy, or no placement."""
    CANCELLING = "CANCELLING"
    """A user asked to cancel; the cluster is being torn down."""
    CANCELLED = "CANCELLED"
    """Terminal. Cancelled and torn down."""

    @property
    def terminal(self) -> bool:
        return self in TERMINAL

    @property
    def failed(self) -> bool:
        return self in (JobStatus.FAILED, JobStatus.REJECTED)

    @property
    def live(self) -> bool:
        """A job that may own instances (not terminal, not merely submitted)."""
        return not self.terminal and self is not JobStatus.SUBMITTED


S = JobStatus
TERMINAL: frozenset[JobStatus] = frozenset({S.SUCCEEDED, S.FAILED, S.REJECTED, S.CANCELLED})

# Every allowed move, once. Anything not here is refused.
TRANSITIONS: dict[JobStatus, frozenset[JobStatus]] = {
    S.SUBMITTED: frozenset({S.VALIDATED, S.REJECTED, S.CANCELLING}),
    S.VALIDATED: frozenset({S.PLACING, S.FAILED, S.CANCELLING}),
    S.PLACING: frozenset({S.PROVISIONING, S.FAILED, S.CANCELLING}),
    # Back to PLACING when every pool of the plan ran out of capacity.
    S.PROVISIONING: frozenset({S.STARTING, S.PLACING, S.FAILED, S.CANCELLING}),
    # A node lost before training started still recovers.
    S.STARTING: frozenset({S.RUNNING, S.RECOVERING, S.FAILED, S.CANCELLING}),
    # RUNNING -> RECOVERING is an unannounced loss or a retryable user error.
    S.RUNNING: frozenset({S.SUCCEEDED, S.CHECKPOINTING, S.RECOVERING, S.FAILED, S.CANCELLING}),
    # Back to RUNNING after a proactive (rebalance) checkpoint; training may also finish meanwhile.
    S.CHECKPOINTING: frozenset({S.RUNNING, S.RECOVERING, S.SUCCEEDED, S.FAILED, S.CANCELLING}),
    S.RECOVERING: frozenset({S.PLACING, S.FAILED, S.CANCELLING}),
    S.CANCELLING: frozenset({S.CANCELLED}),
    S.SUCCEEDED: frozenset(),
    S.FAILED: frozenset(),
    S.REJECTED: frozenset(),
    S.CANCELLED: frozenset(),
}


def can_transition(current: JobStatus, target: JobStatus) -> bool:
    return target in TRANSITIONS[current]


def transition(current: JobStatus, target: JobStatus) -> JobStatus:
    """Return ``target`` if the table allows ``current -> target``; raise otherwise."""
    if not can_transition(current, target):
        raise InvalidTransitionError(f"job status cannot move from {current} to {target}")
    return target
