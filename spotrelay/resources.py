"""One description of the controller's AWS resources, used by the CDK app and the local twin.

Both build from these dataclasses, so the twin cannot drift from what ``cdk deploy`` creates.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Index:
    name: str
    partition_key: str
    sort_key: str | None = None


@dataclass(frozen=True)
class Table:
    logical: str  # construct id and settings key
    env: str  # environment variable handlers read the name from
    default_name: str  # the name the twin uses
    partition_key: str
    sort_key: str | None = None
    indexes: tuple[Index, ...] = ()
    ttl_attribute: str | None = None


@dataclass(frozen=True)
class Rule:
    logical: str
    description: str
    pattern: dict[str, object]
    handler: str | None  # functions/<handler>.py; None when the target is the state machine


@dataclass(frozen=True)
class Resources:
    tables: tuple[Table, ...]
    rules: tuple[Rule, ...]
    bucket_env: str = "SPOTRELAY_BUCKET"
    checkpoint_roots_env: str = "SPOTRELAY_CHECKPOINT_ROOTS"  # s3://bucket/checkpoints/, comma-separated
    dataset_roots_env: str = "SPOTRELAY_DATASET_ROOTS"  # s3://data-bucket/data/, s3://your-bucket/, ...
    fsx_env: str = "SPOTRELAY_FSX_ENABLED"  # "true"/"false": the training regions have FSx for Lustre
    bucket_default: str = "spotrelay-jobs"
    topic_env: str = "SPOTRELAY_TOPIC_ARN"
    topic_default: str = "spotrelay-notifications"
    state_machine_env: str = "SPOTRELAY_STATE_MACHINE_ARN"
    state_machine_default: str = "spotrelay-job-run"
    event_bus_env: str = "SPOTRELAY_EVENT_BUS"
    slack_secret_env: str = "SPOTRELAY_SLACK_SECRET_ARN"
    submissions_prefix: str = "submissions/"
    checkpoints_prefix: str = "checkpoints/"
    code_prefix: str = "code/"  # packed job code, content-addressed: code/<sha256>.tar.gz
    schedule_minutes: int = 1
    handlers: tuple[str, ...] = field(default=())


JOBS = Table(
    "Jobs", "SPOTRELAY_JOBS_TABLE", "spotrelay-jobs", "job_id",
    indexes=(Index("by-status", "status", "updated_at"),),
)
NODES = Table(
    "Nodes", "SPOTRELAY_NODES_TABLE", "spotrelay-nodes", "job_id", "node_id",
    indexes=(Index("by-instance", "instance_id"),),
)
POOLS = Table("PoolStats", "SPOTRELAY_POOLS_TABLE", "spotrelay-pool-stats", "pool_key")
IDEMPOTENCY = Table(
    "Idempotency", "SPOTRELAY_IDEMPOTENCY_TABLE", "spotrelay-idempotency", "id", ttl_attribute="expiration"
)

EC2_STATES = ["stopping", "stopped", "shutting-down", "terminated"]

RULES = (
    Rule(
        "Submissions", "S3 Object Created under submissions/ -> on_submission",
        {
            "source": ["aws.s3"],
            "detail-type": ["Object Created"],
            "detail": {"object": {"key": [{"prefix": "submissions/"}]}},
        },
        "on_submission",
    ),
    Rule(
        "SpotInterruption", "EC2 Spot Instance Interruption Warning -> on_interruption_notice",
        {"source": ["aws.ec2"], "detail-type": ["EC2 Spot Instance Interruption Warning"]},
        "on_interruption_notice",
    ),
    Rule(
        "Rebalance", "EC2 Instance Rebalance Recommendation -> on_rebalance",
        {"source": ["aws.ec2"], "detail-type": ["EC2 Instance Rebalance Recommendation"]},
        "on_rebalance",
    ),
    Rule(
        "InstanceState", "EC2 Instance State-change Notification (going away) -> on_instance_state",
        {
            "source": ["aws.ec2"],
            "detail-type": ["EC2 Instance State-change Notification"],
            "detail": {"state": EC2_STATES},
        },
        "on_instance_state",
    ),
    Rule(
        "AgentEvents", "spotrelay.agent events -> on_agent_event",
        {"source": ["spotrelay.agent"]},
        "on_agent_event",
    ),
)

# Rules forwarded from each training region to the home bus (same EC2 patterns).
FORWARDED_EC2_PATTERNS = tuple(r.pattern for r in RULES if r.pattern["source"] == ["aws.ec2"])

RESOURCES = Resources(
    tables=(JOBS, NODES, POOLS, IDEMPOTENCY),
    rules=RULES,
    handlers=(
        "on_submission", "on_interruption_notice", "on_rebalance", "on_instance_state",
        "on_agent_event", "reconcile",
    ),
)


def function_name_for(handler: str, prefix: str = "spotrelay-") -> str:
    """The Lambda function name of ``functions/<handler>.py`` (CDK and the twin's Lambda seam)."""
    return f"{prefix}{handler.replace('_', '-')}"
