"""A run that refuses to start tells its agent why before the error ends it.

The trainer refuses a checkpoint it cannot use (agent.checkpoint.compat: another engine, model, spec,
layout or global batch; a per-rank data position at another world size; a manifest of a newer
format; a file that would run code or holds a bad field) and a global batch its world cannot split
(agent.batching). The script then exits however it likes (a traceback, or the one-line error
of examples/tiny's ``cli``): a ``refused`` trainer event with the message is what makes the agent
report exit REFUSED with that message, which the controller never retries (docs/checkpoints.md,
"Checkpoints that cannot be used").
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from spotrelay.contracts.control import ENV_ATTEMPT, ENV_CONTROL_DIR, TrainerEvent, append_event
from spotrelay.errors import BatchPlanError, CheckpointError, CheckpointUnavailableError

log = logging.getLogger("spotrelay.training")
# CheckpointError: incompatible, of a newer format, unsafe, or corrupt after every rank agreed on it
# (a trainer file with a bad field): a retry would load the same checkpoint and fail the same way.
REFUSALS = (CheckpointError, BatchPlanError)


def report_refusal(error: Exception, control_dir: Path | None, step: int = 0, world_size: int | None = None,
                   kind: str = "refused") -> None:
    """Append the ``refused`` event (every refusing rank may: the agent takes the first); ``kind``
    "unavailable": checkpoints that could not be read now (the agent reports INFRA_ERROR: retried)."""
    where = control_dir or (Path(os.environ[ENV_CONTROL_DIR]) if os.environ.get(ENV_CONTROL_DIR) else None)
    if where is None:  # not under an agent: the exception alone says it
        return
    attempt = os.environ.get(ENV_ATTEMPT, "")
    try:
        append_event(where, TrainerEvent(kind=kind, step=step, detail=str(error), time=time.time(),
                                         attempt=int(attempt) if attempt.isdigit() else None,
                                         world_size=world_size))  # fmt: skip
    except OSError as exc:  # the refusal itself still ends the run
        log.warning("could not record the refusal in %s: %s", where, exc)


@contextmanager
def refusals(control_dir: Path | None = None, world_size: int | None = None) -> Iterator[None]:
    """Report a refusal raised inside the block, then let it propagate."""
    try:
        yield
    except REFUSALS as exc:
        report_refusal(exc, control_dir, world_size=world_size)
        raise
    except CheckpointUnavailableError as exc:  # not a refusal: it may pass, so the attempt is retried
        report_refusal(exc, control_dir, world_size=world_size, kind="unavailable")
        raise
