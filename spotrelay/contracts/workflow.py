"""Input of the job-run Step Functions execution. Waits and timeouts come from here, not from the
ASL, so tests and the twin run the same graph with short times."""

from __future__ import annotations

import os

from pydantic import BaseModel, ConfigDict, Field


class WorkflowTimings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ready_timeout_s: int = Field(1200, ge=1, description="all nodes must report NodeReady within this")
    heartbeat_s: int = Field(600, ge=1, description="outcome wait fails if no heartbeat this long")
    outcome_timeout_s: int = Field(
        7 * 24 * 3600, ge=1, description="longest outcome wait before a placement review (which waits again)")
    backoff_s: int = Field(30, ge=0, description="first wait before re-placing after a failure")
    backoff_max_s: int = Field(600, ge=0)
    healthy_s: int = Field(3600, ge=1, description="an attempt that ran this long resets the recovery backoff")
    provision_retry_s: int = Field(20, ge=0, description="wait before trying the next plan on capacity errors")

    @classmethod
    def from_env(cls) -> WorkflowTimings:
        """Override any field with SPOTRELAY_WF_<FIELD> (the twin and tests shorten them)."""
        overrides = {
            name: int(os.environ[f"SPOTRELAY_WF_{name.upper()}"])
            for name in cls.model_fields
            if os.environ.get(f"SPOTRELAY_WF_{name.upper()}")
        }
        return cls(**overrides)


class WorkflowInput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    job_id: str
    timings: WorkflowTimings = Field(default_factory=WorkflowTimings)
