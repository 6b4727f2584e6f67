"""Agent events (EventBridge source ``spotrelay.agent``) and controller directives.

The agent publishes events with ``detail-type`` equal to the model's ``kind``; the controller parses
``detail`` with :func:`parse_agent_event`. They are the agent's only writes (its port,
:mod:`spotrelay.contracts.agent`): the controller's handlers turn them into node and job changes.
Directives travel the other way in the node's DynamoDB item (``directive`` attribute) which the
agent polls; it reports each one it took (``DirectiveSeen``) and the controller clears it. See
docs/agent.md.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from spotrelay.contracts.health import HealthAnomaly

AGENT_SOURCE = "spotrelay.agent"
MAX_OUTPUT_TAIL = 2000  # characters of the failing rank's output a TrainingExited may carry


class _Event(BaseModel):
    model_config = ConfigDict(extra="forbid")
    event_id: str = Field(..., min_length=8, description="unique per event; the dedupe key")
    job_id: str
    node_id: str
    instance_id: str
    attempt: int = Field(..., ge=1)
    rank: int = Field(..., ge=0)
    time: float = Field(..., description="epoch seconds on the node")


class NodeReady(_Event):
    kind: Literal["NodeReady"] = "NodeReady"
    private_ip: str
    region: str
    az: str
    master_port: int | None = Field(None, ge=1, le=65535, description="rank 0: the rendezvous port it serves")


class TrainingStarted(_Event):
    """The training command was launched on this node (the node item goes READY -> RUNNING)."""

    kind: Literal["TrainingStarted"] = "TrainingStarted"


class NoticeSeen(_Event):
    """The agent saw a spot interruption notice on IMDS (the EC2 event may be late or lost)."""

    kind: Literal["NoticeSeen"] = "NoticeSeen"
    action: str = "terminate"  # IMDS instance-action: terminate | stop | hibernate
    action_time: float | None = None  # epoch seconds when EC2 acts (the reclaim time)


class DirectiveSeen(_Event):
    """The agent took the directive: the controller clears it from the node item."""

    kind: Literal["DirectiveSeen"] = "DirectiveSeen"
    directive_id: str
    directive_kind: str = ""


class TrackingStarted(_Event):
    """Node rank 0 opened (or found) the job's MLflow run: the controller records its id."""

    kind: Literal["TrackingStarted"] = "TrackingStarted"
    mlflow_run_id: str = Field(..., min_length=1)


class Heartbeat(_Event):
    kind: Literal["Heartbeat"] = "Heartbeat"
    step: int | None = None


class CheckpointCommitted(_Event):
    kind: Literal["CheckpointCommitted"] = "CheckpointCommitted"
    step: int = Field(..., ge=0)
    uri: str
    duration_s: float = Field(..., ge=0)
    emergency: bool = False
    deadline: float | None = None  # epoch seconds, when the save raced a notice
    met_deadline: bool | None = None
    total_bytes: int | None = Field(None, ge=0)  # the whole checkpoint (rank 0's report; placement weighs it)


class TrainingExited(_Event):
    kind: Literal["TrainingExited"] = "TrainingExited"
    exit_code: int
    reason: str  # ExitCode.describe(exit_code) plus detail
    last_step: int | None = None
    last_committed_step: int | None = None
    # the end of the failing rank's output (its traceback, usually): on AWS the node's log goes
    # with the instance, so the cause travels with the event into the job's reasons
    output_tail: str = Field("", max_length=MAX_OUTPUT_TAIL)


class TrainingResumed(_Event):
    """The trainers restored ``step`` (node rank 0 speaks for the gang: every rank loads the same
    step): the attempt's true starting point, which launch can only guess."""

    kind: Literal["TrainingResumed"] = "TrainingResumed"
    step: int = Field(..., ge=0)


# a request with a deadline (a spot notice's) reached a rank whose last save took longer than the time left:
# the controller marks the attempt (Attempt.notice_at_risk; describe's advice)
DEADLINE_AT_RISK = "deadline-at-risk"


class Anomaly(_Event):
    kind: Literal["Anomaly"] = "Anomaly"
    what: str  # deadline-missed | imds-unreachable | upload-failed | a health AnomalyKind ...
    detail: str = ""
    health: HealthAnomaly | None = None  # set for training-health findings (what == health.kind)


AgentEventModel = (NodeReady | Heartbeat | TrainingStarted | NoticeSeen | DirectiveSeen | TrackingStarted
                   | CheckpointCommitted | TrainingExited | TrainingResumed | Anomaly)
AgentEvent = Annotated[AgentEventModel, Field(discriminator="kind")]
_ADAPTER: TypeAdapter[AgentEvent] = TypeAdapter(AgentEvent)


def parse_agent_event(detail: dict[str, object]) -> AgentEvent:
    return _ADAPTER.validate_python(detail)


class DirectiveKind(StrEnum):
    CHECKPOINT_NOW = "CHECKPOINT_NOW"  # save at the next step boundary, then exit PREEMPTED_SAVED
    CHECKPOINT = "CHECKPOINT"  # proactive save (rebalance); keep training
    STOP = "STOP"  # stop without saving (cancel)
    RESTART = "RESTART"  # restart the training command from the latest checkpoint


class Directive(BaseModel):
    model_config = ConfigDict(extra="forbid")
    directive_id: str
    kind: DirectiveKind
    deadline: float | None = None  # epoch seconds by which the checkpoint must be durable
    reason: str = ""
    issued_at: float
    attempt: int | None = Field(None, ge=1, description="RESTART: the attempt this node joins")
    rank: int | None = Field(None, ge=0, description="RESTART: its rank in that attempt")
    world_size: int | None = Field(
        None, ge=1, description="RESTART: ranks 0..world_size-1 train in that attempt (None: unchanged)")

    @classmethod
    def restart(cls, job_id: str, attempt: int, rank: int, now: float, reason: str,
                world_size: int | None = None) -> Directive:
        """A survivor kept by replace-lost-nodes joins ``attempt`` as ``rank`` of ``world_size`` ranks
        (its local tier stays; an elastic gang may have grown or shrunk meanwhile)."""
        return cls(directive_id=f"restart-{job_id}-a{attempt}", kind=DirectiveKind.RESTART, issued_at=now,
                   reason=reason, attempt=attempt, rank=rank, world_size=world_size)


def parse_directive(raw: object) -> Directive:
    """The directive in a node item (``ValidationError`` when it is not one)."""
    return Directive.model_validate(raw)
