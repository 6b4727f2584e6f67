"""Exit codes with one meaning each, used by the trainer, the agent and the controller."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    DONE = 0
    """Training finished every step."""
    USER_ERROR = 1
    """The training script failed (any code not listed here counts as a user error too)."""
    PREEMPTED_SAVED = 75
    """Stopped on request (preemption or STOP) after a checkpoint of the stop step was committed."""
    PREEMPTED_UNSAVED = 76
    """Stopped on request but the checkpoint could not be committed before the deadline."""
    INFRA_ERROR = 77
    """Infrastructure failed under the trainer (rendezvous, network, disk, IMDS); not the user's code."""
    CANCELLED = 78
    """Stopped by a STOP directive without a save (job cancelled)."""
    UNHEALTHY = 79
    """Stopped by the health policy (``stop``, or rollbacks spent); counts as a user error."""
    REFUSED = 80
    """The trainer refused to start: a checkpoint this run cannot use (another engine, model, spec or
    layout) or a global batch its world cannot split. The agent reports it whatever code the script
    exited with (the trainer's ``refused`` event says so); never retried: the job fails with the reason."""

    @classmethod
    def describe(cls, code: int) -> str:
        try:
            return cls(code).name.lower().replace("_", "-")
        except ValueError:
            return "user-error" if code > 0 else "killed-by-signal"
