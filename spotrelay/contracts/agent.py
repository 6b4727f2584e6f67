"""The agent's port: everything a node agent says to the controller and learns from it.

One writer per record (DESIGN.md section 6): the agent never writes a node or job item. It
*reports* (register = NodeReady, heartbeat, training started, a notice it saw on IMDS, a directive
it took, its MLflow run, checkpoints, its exit) as events from :mod:`spotrelay.contracts.events`,
and the controller's handlers (``services/node_events.py``) change the records. It *reads* what the
controller wrote: its own node (the directive; whether its NodeReady landed), the job's nodes
(rank 0's address and port, ranks still draining, a later attempt that adopts this instance) and
the job (spec, MLflow run, lifecycle numbers), as the read-only views below.

The views are the agent's copy of the record fields it may see, as plain text and numbers: the agent
does not import the domain models, the job store or the controller's settings (a test parses its
imports). Adapters: ``spotrelay/adapters/aws_agent_port.py`` (EventBridge + DynamoDB reads) and the
tests' in-memory ports.
"""

from __future__ import annotations

from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from spotrelay.contracts.events import AgentEventModel

# MLflow tags a resumed job's spec carries (services/resume.py writes them; agent/tracking.py reads the run)
RESUMED_FROM_TAG = "spotrelay.resumed_from"  # the job it goes on from
RESUMED_RUN_TAG = "spotrelay.resumed_run"  # that job's parent run, which the resumed job continues

# Node states as the controller writes them (spotrelay.domain.models.NodeState values).
PENDING, READY, RUNNING, DOOMED, EXITED = "PENDING", "READY", "RUNNING", "DOOMED", "EXITED"
UP = (READY, RUNNING)  # registered and (about to be) training
# Job statuses after which nothing runs again (JobStatus.terminal; a unit test keeps them equal).
TERMINAL = frozenset({"SUCCEEDED", "FAILED", "CANCELLED", "REJECTED"})


# What the port's reads need on the jobs and nodes tables (IAM actions; the per-job policy, the
# agents' permissions boundary and the fallback role grant exactly these: no write).
AGENT_TABLE_ACTIONS = ("dynamodb:GetItem", "dynamodb:Query")


def node_id_for(attempt: int, rank: int) -> str:
    """A node's id within its job: one record per (attempt, rank)."""
    return f"a{attempt}-r{rank}"


class NodeView(BaseModel):
    """What the agent may know of a node record."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    job_id: str
    node_id: str
    attempt: int
    rank: int
    instance_id: str = ""
    state: str = PENDING
    private_ip: str | None = None
    master_port: int | None = None
    spare: bool = False
    release_after: float | None = None  # a rank of an earlier attempt left to drain after a notice
    directive: dict[str, Any] | None = None  # a Directive as the controller wrote it (parse it)


class PoolView(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)
    region: str = ""
    az: str = ""
    instance_type: str = ""
    market: str = ""

    @property
    def key(self) -> str:
        return f"{self.region}/{self.az}/{self.instance_type}/{self.market}"


class AttemptView(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)
    number: int
    pool: PoolView | None = None
    ended_at: float | None = None
    end_reason: str | None = None
    nodes: int = 0
    loss_interval_s: float | None = None  # the auto checkpoint cadence's input (domain/cadence.py)


class JobView(BaseModel):
    """What the agent may know of its job record."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    job_id: str
    status: str = ""
    attempt: int = 0
    spec: dict[str, Any] = Field(default_factory=dict)
    spec_hash: str = ""
    training_hash: str = ""  # what a resume is checked against (a record from before it: none)
    mlflow_run_id: str | None = None
    attempts: list[AttemptView] = Field(default_factory=list)
    steps_lost: int = 0
    cost_so_far: float = 0.0
    recoveries: int = 0

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL


class AgentPort(Protocol):
    """The agent's only channel to the controller (one job's records, read-only, plus events)."""

    def report(self, event: AgentEventModel) -> None:
        """Publish an event for the controller; raises when it could not be sent."""
        ...

    def node(self, node_id: str) -> NodeView | None:
        """This node's record: the directive read path (one consistent GetItem), polled often."""
        ...

    def nodes(self) -> list[NodeView]:
        """Every node record of the job (rendezvous, drain and adoption; polled while waiting)."""
        ...

    def job(self) -> JobView | None: ...

    def durable_root(self) -> str:
        """``s3://<bucket>/<checkpoints prefix>`` of this deployment (a job's default durable tier)."""
        ...


# --- what the agent works out from the views (pure) ---------------------------------------------
def rank0_address(nodes: list[NodeView], attempt: int) -> tuple[str, int | None] | None:
    """Rank 0's address and published port once the controller recorded its NodeReady."""
    for node in nodes:
        if node.attempt == attempt and node.rank == 0 and not node.spare and node.private_ip and node.state in UP:
            return node.private_ip, node.master_port
    return None


def next_assignment(nodes: list[NodeView], instance_id: str | None, attempt: int) -> NodeView | None:
    """The newest record of a later attempt that adopts this instance (a survivor carried on, or a
    spare promoted, by recover); None while there is none."""
    later = [n for n in nodes if n.instance_id == instance_id and n.attempt > attempt and not n.spare]
    return max(later, key=lambda n: n.attempt) if later else None


def draining_ranks(nodes: list[NodeView], attempt: int, now: float) -> list[int]:
    """Ranks of earlier attempts left to finish their emergency save after a notice
    (``release_after`` set by recover) that have not exited yet: replacements wait for them."""
    return sorted(n.rank for n in nodes
                  if n.attempt < attempt and not n.spare and n.release_after is not None and now < n.release_after
                  and n.state in (READY, RUNNING, DOOMED))
