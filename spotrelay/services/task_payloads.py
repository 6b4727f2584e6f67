"""Payloads the job-run workflow sends its Lambda tasks (the ASL's ``Parameters``), validated."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from spotrelay.contracts.recovery import AttemptEnd, LaunchPlan, RecoveryPlan, ReviewBackoff
from spotrelay.contracts.workflow import WorkflowTimings


class _Task(BaseModel):
    model_config = ConfigDict(extra="ignore")
    job_id: str = Field(..., min_length=1)


class PlanTask(_Task):
    timings: WorkflowTimings = Field(default_factory=WorkflowTimings)
    recovery: RecoveryPlan = Field(default_factory=RecoveryPlan)


class ProvisionTask(_Task):
    timings: WorkflowTimings = Field(default_factory=WorkflowTimings)
    plan: LaunchPlan | None = None
    standby: AttemptEnd | None = None  # the Prewarm state: a rebalance verdict
    move: AttemptEnd | None = None  # the Migrate state: a review's migrate verdict

    @model_validator(mode="after")
    def _one(self) -> ProvisionTask:
        if sum(x is not None for x in (self.plan, self.standby, self.move)) != 1:
            raise ValueError("give one of 'plan' (Provision), 'standby' (Prewarm) or 'move' (Migrate)")
        return self


class RegisterWaitTask(_Task):
    wait: Literal["ready", "outcome"]
    attempt: int = Field(..., ge=1)
    task_token: str = Field(..., min_length=1)


class RecoverTask(_Task):
    timings: WorkflowTimings = Field(default_factory=WorkflowTimings)
    outcome: AttemptEnd


class ReviewTask(_Task):
    attempt: int = Field(..., ge=1)
    timings: WorkflowTimings = Field(default_factory=WorkflowTimings)
    # $.launch.review_s: the wait that just ended (read only for an older definition, where it is the backoff)
    review_s: int | None = Field(None, ge=1)
    review_mark: str | None = Field(None, max_length=64)  # $.launch.review_mark: the prices the last full review read
    # $.launch.review_backoff: when the next full review is due (an execution of a definition older than
    # the price polls passes none: ``polls`` is then False and the review answers as it did)
    review_backoff: ReviewBackoff | None = None

    @property
    def polls(self) -> bool:
        """The workflow's definition passes the backoff (null for a new attempt): it polls the prices."""
        return "review_backoff" in self.model_fields_set


class TeardownTask(_Task):
    pass


class HandOverTask(_Task):
    resume_at: Literal["plan", "review", "wait"]
    data: dict[str, Any]  # the execution's whole state


class FinalizeTask(_Task):
    result: Literal["SUCCEEDED", "FAILED", "CANCELLED"]
    error: dict[str, Any] | None = None
    outcome: AttemptEnd | None = None
