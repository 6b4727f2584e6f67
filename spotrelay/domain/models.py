"""Job, node and attempt records as the job store keeps them."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from enum import StrEnum
from functools import cached_property
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from spotrelay.contracts.agent import node_id_for as node_id_for  # one spelling, shared with the agent
from spotrelay.domain.status import JobStatus


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Pool(Record):
    """Where a gang can be launched: one AZ, one instance type, one market."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    region: str
    az: str
    instance_type: str
    market: str  # "spot" | "on-demand"

    @cached_property
    def key(self) -> str:
        # kept once built (placement reads it hundreds of times a review); a frozen record never changes,
        # and pydantic leaves a cached property out of equality, hashing and dumps
        return f"{self.region}/{self.az}/{self.instance_type}/{self.market}"

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Pool:
        copied = super().model_copy(update=update, deep=deep)
        copied.__dict__.pop("key", None)  # a copy with other fields must not keep this key
        return copied


class CheckpointRef(Record):
    step: int
    uri: str
    committed_at: float  # epoch seconds
    duration_s: float | None = None


class Attempt(Record):
    """One launch of the cluster. A job has attempt 1, then one more per recovery or restart."""

    number: int
    pool: Pool | None = None
    started_at: float | None = None
    ended_at: float | None = None
    end_reason: str | None = None  # interrupted | node-lost | user-error | succeeded | cancelled
    resumed_from_step: int | None = None
    resumed_at: float | None = None  # when its trainers restored resumed_from_step (TrainingResumed's time)
    saved_step: int | None = None  # the newest checkpoint its ranks committed (CheckpointCommitted)
    saved_at: float | None = None  # when that commit happened (with resumed_at: the job's measured step rate)
    reached_step: int | None = None  # the furthest step its ranks reported (heartbeat, exit, its own save)
    lost_steps: int | None = None  # its steps no checkpoint kept, once known (counted in Job.steps_lost once)
    cost: float = 0.0  # launch to close (closed_attempt); billed past the close: ``drain_cost``
    # USD its instances were billed past its close (ranks finishing a notice's or a move's save, survivors
    # kept through the replacements' backoff), charged as each is released or joins the next attempt
    drain_cost: float = 0.0
    # USD of its clock left out of ``cost``: instances EC2 interrupted in their first hour, which EC2 does
    # not bill (domain/cost.unbilled_node_seconds; noticed, or taken without a notice: services/interruptions)
    unbilled: float = 0.0
    price_per_hour: float = 0.0  # USD per instance-hour at launch (the open attempt's estimate)
    # USD per instance-hour EC2 billed over its life, once closed: the spot price history's time-weighted
    # mean (AWS bills the price in effect, not the launch price; domain/cost.mean_price). None: launch price.
    # While it runs, it is read hourly (the reconcile sweep), up to ``price_checked_at``
    price_in_effect: float | None = None
    price_checked_at: float | None = None
    nodes: int = 0  # instances billed for this attempt (hot spares included)
    spares: int = 0  # of those, hot spares out of training (resources.spares)
    world_size: int = 0  # ranks training (an elastic gang: resources.min_nodes..nodes; 0 in old records)
    # of ``nodes``, instances carried over from the attempt before (survivors kept, spares promoted): billed
    # before this attempt started in that one's record (spot_evidence.billed counts them once)
    kept: int = 0
    # placement's mean seconds between this gang's losses without a notice (None: none expected or an
    # old record): what ``checkpoint.every_minutes: auto`` reads (domain/cadence.py)
    loss_interval_s: float | None = None
    # a notice reached its ranks with less time left than their last save took (the agent's deadline-at-risk):
    # the notice's own save could not be counted on (describe's advice reads it: domain/advice.py)
    notice_at_risk: bool = False

    def billed_price(self) -> float:
        """USD per instance-hour its cost was counted at: the price in effect once known, else at launch."""
        return self.price_per_hour if self.price_in_effect is None else self.price_in_effect


class Earlier(Record):
    """The attempts folded out of a job record, which keeps its newest ``ATTEMPTS_KEPT`` in full
    (services/history.py: DynamoDB refuses an item over 400 KB, about 650 attempts): what the readers of
    the whole history take from them, so that each gives the answer it would over every attempt."""

    count: int = 0
    first_started_at: float | None = None  # the schedule's first start (spot_evidence.progress)
    first_resumed_from_step: int | None = None  # the step the job's training began from (the same)
    saved_step: int | None = None  # their newest commit
    # the newest of them that trained from its resume to a later commit (the measured step rate's attempt)
    measured: Attempt | None = None
    paid: float = 0.0  # cost + drain_cost (savings.finished_job, describe's cost lines)
    on_demand: float | None = 0.0  # the same instance-hours on on-demand (None: unknown for one of them)
    unbilled: float = 0.0
    downtime_s: float = 0.0  # gaps between consecutive folded attempts (notify.total_downtime)
    last_ended_at: float | None = None  # the newest folded attempt's end (the gap to the first kept one)
    last_market: str | None = None  # its market (a return to on-demand across the fold)
    returns_to_on_demand: int = 0  # spot -> on-demand among them (spot_evidence.returns_to_on_demand)
    last_spot_end: float | None = None  # the newest end of a folded spot attempt (off_on_demand_allowed)
    stalled_run: int = 0  # the newest ended ones in a row that were spot gangs committing nothing (stall limit)
    stints_h: list[float] = Field(default_factory=list)  # the newest closed spot stints (payback.spot_stint_hours)
    stint_from: float | None = None  # a spot stint still open at the fold: its first attempt's start


class AnomalyRecord(Record):
    """A training-health finding as the job keeps it (``spotrelay describe`` lists them)."""

    attempt: int
    node_id: str
    kind: str  # spotrelay.contracts.health.AnomalyKind
    action: str  # spotrelay.contracts.health.HealthAction
    step: int
    rank: int | None = None
    detail: str = ""
    time: float = 0.0


class Job(Record):
    job_id: str
    name: str
    status: JobStatus
    version: int = 0  # bumped on every write; conditional writes check it
    spec: dict[str, Any] = Field(default_factory=dict)
    spec_hash: str = ""
    training_hash: str = ""  # the spec's training definition (spec.training_hash): what checkpoints record
    submission_key: str = ""
    submission_etag: str = ""
    submission_sequencer: str | None = None  # S3's per-write sequencer: a redrop differs, a redelivery does not
    submit_tries: int = 0  # unexpected failures while validating/starting; bounded (services/submit.py)
    reasons: list[str] = Field(default_factory=list)  # why REJECTED / FAILED
    created_at: float = 0.0
    updated_at: float = 0.0
    execution_arn: str | None = None
    attempt: int = 0
    attempts: list[Attempt] = Field(default_factory=list)  # the newest ATTEMPTS_KEPT (services/history.py)
    earlier: Earlier | None = None  # those folded out of ``attempts``; None: none yet
    recoveries: int = 0
    stalled_recoveries: int = 0  # recoveries in a row with no newer checkpoint committed (recovery/budget.py)
    progress_step: int = 0  # the newest committed step when the stall count was last reset
    user_restarts: int = 0
    excluded_pools: list[str] = Field(default_factory=list)  # pool keys not to use next placement
    last_checkpoint: CheckpointRef | None = None
    # the newest durable checkpoint's whole size (every rank's shards), as its committing rank reported
    # it: placement weighs sending it between regions when the spec does not state checkpoint.size_gb
    checkpoint_bytes: int | None = None
    last_step: int = 0
    steps_lost: int = 0
    cost_so_far: float = 0.0
    standby_cost: float = 0.0  # of cost_so_far: rebalance standbys' own time (services/prewarm.py)
    budget_warned_at: float | None = None  # when people were told the budget is nearly spent (once)
    # a stop that waits for the ranks' save (services/stop.py: cancel --save, the budget): until when,
    # and the error and cause the workflow's waits get then
    stop_save_by: float | None = None
    stop_error: str | None = None
    stop_reason: str | None = None
    task_tokens: dict[str, str] = Field(default_factory=dict)  # wait name -> Step Functions token
    mlflow_run_id: str | None = None
    anomalies: list[AnomalyRecord] = Field(default_factory=list)  # newest last, at most MAX_ANOMALIES


MAX_ANOMALIES = 50


class NodeState(StrEnum):
    PENDING = "PENDING"  # launched, agent not registered yet
    READY = "READY"  # agent registered and reported NodeReady
    RUNNING = "RUNNING"  # training is running
    DOOMED = "DOOMED"  # a spot interruption was announced for it
    LOST = "LOST"  # gone without notice (state change, stale heartbeat)
    EXITED = "EXITED"  # training exited; agent done
    TERMINATED = "TERMINATED"  # we terminated it or EC2 confirmed it gone


class Node(Record):
    job_id: str
    node_id: str  # "a<attempt>-r<rank>", unique within the job
    attempt: int
    rank: int
    instance_id: str
    pool: Pool
    state: NodeState = NodeState.PENDING
    private_ip: str | None = None
    launched_at: float = 0.0
    last_heartbeat: float | None = None
    version: int = 0
    directive: dict[str, Any] | None = None  # CHECKPOINT_NOW / STOP / RESTART for the agent
    master_port: int | None = None  # rank 0's agent sets the rendezvous port it serves; others follow it
    exit_code: int | None = None
    output_tail: str | None = None  # the end of a failing rank's output (TrainingExited)
    reclaim_at: float | None = None  # DOOMED: when EC2 takes the instance (the notice's deadline)
    # EC2's interruption notice (not a move's or a health check's doom): when EC2 takes the instance;
    # or, for one EC2 took without a notice we saw (its StateReason), when it went. Released in its
    # first hour it is left to EC2, whose interruption is not billed (domain/cost.py)
    ec2_reclaim_at: float | None = None
    release_after: float | None = None  # left to finish its emergency save: nobody terminates it before this
    spare: bool = False  # a hot spare: agent up, out of training, newest checkpoint local; takes a lost rank
    takes_rank: int | None = None  # a spare recover promoted: it joins the next attempt as this rank


def job_id_for(key: str, etag: str) -> str:
    """A job id that a redelivered S3 event maps to the same value: (key, etag) -> id."""
    digest = hashlib.sha256(f"{key}\n{etag.strip(chr(34))}".encode()).hexdigest()[:12]
    stem = key.rsplit("/", 1)[-1].rsplit(".", 1)[0].lower()
    safe = "".join(c if c.isalnum() or c == "-" else "-" for c in stem)[:40].strip("-") or "job"
    return f"{safe}-{digest}"

