"""Training health: what the session checks, what it found, and what the policy does about it.

The job spec's ``health`` section is a :class:`HealthPolicy`; the agent hands it to the training
processes as JSON in ``SPOTRELAY_HEALTH``. A finding is a :class:`HealthAnomaly`: the session
appends it to ``events.jsonl`` (kind ``anomaly``), the agent publishes it inside an ``Anomaly``
event, and the controller records it on the job and acts on ``action``. See docs/training-api.md.
"""

from __future__ import annotations

import math
import os
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

ENV_HEALTH = "SPOTRELAY_HEALTH"


class AnomalyKind(StrEnum):
    NON_FINITE = "non-finite"  # NaN/Inf in the loss or the gradient norm on some rank
    LOSS_SPIKE = "loss-spike"  # robust z-score of the loss over the recent window above the limit
    GRAD_EXPLOSION = "grad-explosion"  # gradient norm far above its recent median (or an absolute cap)
    STRAGGLER = "straggler"  # one rank's step time far above the ranks' median, sustained
    HANG = "hang"  # no finished step for hang_after_s while the training processes live (agent)


class HealthAction(StrEnum):
    ROLLBACK = "rollback"  # restore the newest checkpoint before the anomaly, skip its data window
    REPLACE_NODE = "replace-node"  # checkpoint, exclude the node's instance, replace that rank
    STOP = "stop"  # exit UNHEALTHY (79): the job ends FAILED with the reason
    NOTIFY = "notify"  # report and keep training


DEFAULT_ACTIONS: dict[AnomalyKind, HealthAction] = {
    AnomalyKind.NON_FINITE: HealthAction.ROLLBACK,
    AnomalyKind.LOSS_SPIKE: HealthAction.ROLLBACK,
    AnomalyKind.GRAD_EXPLOSION: HealthAction.NOTIFY,
    AnomalyKind.STRAGGLER: HealthAction.REPLACE_NODE,
    AnomalyKind.HANG: HealthAction.ROLLBACK,
}


def finite_limit(value: Any, unset: str) -> Any:
    """``value`` as given, or a ValueError for infinity or NaN in any form read as a float (YAML's ``.inf``,
    ``"inf"``, ``1e999``): JSON writes them as null, so an optional limit given one was silently no limit.
    ``unset`` says how to ask for that instead. (A before-validator: NaN failed the bound's own check,
    and infinity passed it.)"""
    if isinstance(value, int | float | str) and not isinstance(value, bool):
        try:
            number = float(value)
        except (ValueError, OverflowError):
            return value  # (not a number: the field's own check says so)
        if not math.isfinite(number):
            raise ValueError(f"must be a finite number; {unset} (got {value!r})")
    return value


class HealthPolicy(BaseModel):
    """The spec's ``health`` section. Every check is on unless its limit is null."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    enabled: bool = True
    window: int = Field(50, ge=5, le=10_000, description="steps of history for the spike and explosion checks")
    warmup_steps: int = Field(20, ge=0, description="no spike/explosion/straggler checks before this many steps")
    loss_spike_z: float | None = Field(8.0, gt=0, description="robust z-score (median/MAD) that flags a spike")
    grad_norm_factor: float | None = Field(20.0, gt=1, description="grad norm above this x its window median")
    grad_norm_max: float | None = Field(None, gt=0, description="absolute grad-norm limit")
    straggler_factor: float | None = Field(1.5, gt=1, description="a rank's mean step time above this x the median")
    straggler_every: int = Field(20, ge=2, le=10_000, description="steps per straggler comparison")
    straggler_checks: int = Field(2, ge=1, le=100, description="consecutive comparisons that must flag the rank")
    # finite: JSON writes infinity as null, which the ranks could not read back (SPOTRELAY_HEALTH)
    straggler_min_s: float = Field(0.05, ge=0, allow_inf_nan=False, description="and at least this many seconds "
                                   "slower per step: scheduling jitter on millisecond steps is not a bad node")
    hang_after_s: float | None = Field(1800.0, gt=0, description="no finished step for this long is a hang")
    max_rollbacks: int = Field(3, ge=0, le=100, description="rollbacks per attempt; then the action becomes stop")
    actions: dict[AnomalyKind, HealthAction] = Field(default_factory=lambda: dict(DEFAULT_ACTIONS))

    @field_validator("loss_spike_z", "grad_norm_factor", "grad_norm_max", "straggler_factor", "hang_after_s",
                     mode="before")
    @classmethod
    def _finite(cls, value: Any) -> Any:
        return finite_limit(value, "null turns the check off")

    def action(self, kind: AnomalyKind) -> HealthAction:
        return self.actions.get(kind, DEFAULT_ACTIONS[kind])

    @classmethod
    def from_env(cls) -> HealthPolicy:
        raw = os.environ.get(ENV_HEALTH)
        return cls.model_validate_json(raw) if raw else cls()


class HealthAnomaly(BaseModel):
    """One finding, agreed by every rank (the hang: by the agent of one node)."""

    model_config = ConfigDict(extra="forbid")
    kind: AnomalyKind
    action: HealthAction
    step: int = Field(..., ge=0, description="the step whose boundary found it (steps finished)")
    rank: int | None = Field(None, description="the global rank at fault (straggler), else None")
    node_rank: int | None = Field(None, description="the node of that rank")
    value: float | None = None  # the loss, grad norm, z-score or step-time ratio that tripped
    detail: str = ""
    rollback_to: int | None = Field(None, description="rollback: the checkpoint step restored")
    skipped_batches: int = 0  # rollback: batches of the offending window that were skipped
