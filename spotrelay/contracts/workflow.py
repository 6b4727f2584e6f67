"""Input of the job-run Step Functions execution. Waits and timeouts come from here, not from the
ASL, so tests and the twin run the same graph with short times."""

from __future__ import annotations

import os
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

# A Standard execution lasts at most a year: a wait, timeout or duration longer than that can never end
# its state (and Step Functions refuses a Wait over 99,999,999 s at run time, failing the execution there).
# Refused here, where the value is read, so a bad SPOTRELAY_WF_* or --switch names its field instead.
MAX_WAIT_S = 365 * 24 * 3600


class WorkflowTimings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ready_timeout_s: int = Field(1200, ge=1, le=MAX_WAIT_S, description="all nodes must report NodeReady within this")
    heartbeat_s: int = Field(600, ge=1, le=MAX_WAIT_S, description="outcome wait fails if no heartbeat this long")
    outcome_timeout_s: int = Field(7 * 24 * 3600, ge=1, le=MAX_WAIT_S,
                                   description="longest outcome wait before a placement review (which waits again)")
    backoff_s: int = Field(30, ge=0, le=MAX_WAIT_S, description="first wait before re-placing after a failure")
    backoff_max_s: int = Field(600, ge=0, le=MAX_WAIT_S)
    healthy_s: int = Field(3600, ge=1, le=MAX_WAIT_S,
                           description="an attempt that ran this long resets the recovery backoff")
    provision_retry_s: int = Field(20, ge=0, le=MAX_WAIT_S,
                                   description="wait before trying the next plan on capacity errors")
    # EC2 reclaims several nodes of a pool at once and their notices (or state changes) arrive within
    # seconds: recovering on the first alone kept survivors that were already going. Out of a notice's
    # 120 s: the replacements boot this much later (the old ranks' save is timed by the deadline)
    loss_settle_s: int = Field(5, ge=0, le=MAX_WAIT_S,
                               description="after a notice or a loss, wait this long for the rest of its wave "
                                           "before recovering (GatherLosses)")
    # Step Functions ends an execution at 25,000 history events; a pass through Plan, Review or Prewarm
    # writes at most ~75 of them until the next (a recovery: the outcome, GatherLosses, Recover, Backoff,
    # Plan, Provision and the waits; a poll ~22; a rebalance's prewarm ~17), so after this many passes the
    # job goes on in a new execution (HandOverPlan / HandOverReview / HandOverWait, services/handover.py):
    # ~5 days of 30-minute polls, fewer on a stormy market
    max_hops: int = Field(250, ge=1, le=300, description="passes through Plan, Review or Prewarm before the job's "
                                                        "workflow goes on in a new execution (the 25,000-event "
                                                        "history)")
    # Plan measures its waits (the wait for spot, its re-checks) on the clock: a twin that runs modeled
    # time faster must shorten them where Plan computes them, not in the ASL's Wait (docs/local-twin.md)
    time_scale: float = Field(
        1.0, gt=0, description="clock seconds per second of Plan's waits (spot_wait_minutes, re-checks); 1 on AWS")

    @field_validator("*", mode="before")
    @classmethod
    def _no_booleans(cls, value: Any) -> Any:
        # every timing is a number: `--switch heartbeat_s=true` (read as YAML) is refused, not taken as 1
        if isinstance(value, bool):
            raise ValueError(f"expected a number, got {str(value).lower()}")
        return value

    @classmethod
    def from_env(cls) -> WorkflowTimings:
        """Override any field with SPOTRELAY_WF_<FIELD> (the twin and tests shorten them)."""
        overrides = {
            name: os.environ[f"SPOTRELAY_WF_{name.upper()}"]
            for name in cls.model_fields
            if os.environ.get(f"SPOTRELAY_WF_{name.upper()}")
        }
        return cls.model_validate(overrides)  # "0.01" -> float, "20" -> int; a bad value names its field


class WorkflowInput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    job_id: str
    timings: WorkflowTimings = Field(default_factory=WorkflowTimings)
