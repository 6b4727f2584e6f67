"""The per-job agent roles: their permissions boundary and what the compute adapter needs to create them.

The controller creates one role and instance profile per job at launch
(``spotrelay/adapters/iam_job_profile.py``, names ``/spotrelay/<prefix>-agent-job-<hash>``) whose
inline policy names only that job's checkpoint prefix, spec object and table items. The controller may
create such roles only with this boundary attached (``iam:PermissionsBoundary`` condition in
``cdk/permissions.py``), so even a wrong inline policy cannot grant a node more than the agent needs in
general: the checkpoints of the jobs and data buckets, ``data/`` and the agent wheel, the job specs
under ``submissions/``, reads of job and node items (the agent writes none: it reports events), and
PutEvents with source ``spotrelay.agent``.
"""

from __future__ import annotations

from typing import Any

from aws_cdk import Aws
from aws_cdk import aws_iam as iam
from constructs import Construct

from cdk.config import AppConfig
from cdk.storage import jobs_bucket_name, table_name
from spotrelay.contracts.agent import AGENT_TABLE_ACTIONS
from spotrelay.contracts.events import AGENT_SOURCE
from spotrelay.ports.logs import LOG_GROUP_DEFAULT
from spotrelay.resources import JOBS, NODES, RESOURCES

PATH = "/spotrelay/"


def boundary_name(config: AppConfig) -> str:
    return f"{config.prefix}-agent-boundary"


def boundary_arn(config: AppConfig) -> str:
    return f"arn:{Aws.PARTITION}:iam::{Aws.ACCOUNT_ID}:policy{PATH}{boundary_name(config)}"


def job_role_arns(prefix: str) -> tuple[str, str]:
    """(roles, instance profiles) the controller manages: only the per-job ones, under /spotrelay/."""
    base = f"arn:{Aws.PARTITION}:iam::{Aws.ACCOUNT_ID}"
    return f"{base}:role{PATH}{prefix}-agent-job-*", f"{base}:instance-profile{PATH}{prefix}-agent-job-*"


def _data_bucket(config: AppConfig, region: str) -> str:
    from cdk.regional_stack import data_bucket_name  # the regional stacks own the data buckets

    return data_bucket_name(config, region)


def event_bus_arn(config: AppConfig) -> str:
    return f"arn:{Aws.PARTITION}:events:{config.home_region}:{Aws.ACCOUNT_ID}:event-bus/default"


def checkpoint_buckets(config: AppConfig) -> list[str]:
    """The buckets whose ``checkpoints/`` a node may use: the boundary's, and the handlers'
    ``SPOTRELAY_CHECKPOINT_ROOTS`` (a submission whose ``checkpoint.s3_prefix`` is elsewhere is refused)."""
    return [jobs_bucket_name(config, config.home_region), *(_data_bucket(config, r) for r in config.training_regions)]


def dataset_roots(config: AppConfig) -> list[str]:
    """Where a job's dataset may be (the handlers' ``SPOTRELAY_DATASET_ROOTS``): the data buckets' ``data/``
    and the whole of each bucket the deployment lists in ``dataset_buckets``."""
    data = [f"s3://{_data_bucket(config, r)}/data/" for r in config.training_regions]
    return data + [f"s3://{b}/" for b in config.dataset_buckets]


def dataset_statements(config: AppConfig) -> list[iam.PolicyStatement]:
    """Reading the team's own dataset buckets (``dataset_buckets``; each job's policy names its dataset):
    the boundary's, and the shared agent role's (cdk/agent_fleet.py)."""
    if not config.dataset_buckets:
        return []
    part = Aws.PARTITION
    buckets = [f"arn:{part}:s3:::{b}" for b in config.dataset_buckets]
    return [iam.PolicyStatement(actions=["s3:GetObject"], resources=[f"{b}/*" for b in buckets]),
            iam.PolicyStatement(actions=["s3:ListBucket"], resources=buckets)]


def job_profiles_config(config: AppConfig) -> dict[str, Any]:
    """``Ec2ComputeConfig.job_profiles`` for the handlers (JSON in SPOTRELAY_EC2_CONFIG)."""
    return {
        "prefix": config.prefix,
        "partition": Aws.PARTITION,
        "account": Aws.ACCOUNT_ID,
        "home_region": config.home_region,
        "jobs_bucket": jobs_bucket_name(config, config.home_region),
        "jobs_table": table_name(config, JOBS),
        "nodes_table": table_name(config, NODES),
        "event_bus_arn": event_bus_arn(config),
        "data_buckets": {r: _data_bucket(config, r) for r in config.training_regions},
        "permissions_boundary_arn": boundary_arn(config),
    }


class AgentBoundary(Construct):
    """The managed policy every per-job agent role must carry as its permissions boundary."""

    def __init__(self, scope: Construct, id: str, *, config: AppConfig) -> None:
        super().__init__(scope, id)
        part, acct, home = Aws.PARTITION, Aws.ACCOUNT_ID, config.home_region
        ckpt = f"{RESOURCES.checkpoints_prefix}*"
        home_bucket, *data = (f"arn:{part}:s3:::{b}" for b in checkpoint_buckets(config))
        table = f"arn:{part}:dynamodb:{home}:{acct}:table/"
        self.policy = iam.ManagedPolicy(
            self,
            "Policy",
            managed_policy_name=boundary_name(config),
            path=PATH,
            description="spotrelay: the most a per-job agent role may ever be allowed (permissions boundary)",
            statements=[
                iam.PolicyStatement(
                    actions=["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"],
                    resources=[f"{b}/{ckpt}" for b in [home_bucket, *data]],
                ),
                iam.PolicyStatement(
                    actions=["s3:ListBucket"],
                    resources=[home_bucket, *data],
                    conditions={"StringLike": {"s3:prefix": [ckpt, "data/*"]}},
                ),
                iam.PolicyStatement(
                    actions=["s3:GetObject"],
                    resources=[f"{home_bucket}/{p}*" for p in (RESOURCES.submissions_prefix, RESOURCES.code_prefix)]
                    + [f"{b}/{p}*" for b in data for p in ("data/", "artifacts/agent/")],
                ),
                *dataset_statements(config),
                iam.PolicyStatement(
                    actions=list(AGENT_TABLE_ACTIONS),  # read only: the agent reports events, it writes no item
                    resources=[table + table_name(config, NODES), table + table_name(config, JOBS)],
                ),
                iam.PolicyStatement(
                    actions=["events:PutEvents"],
                    resources=[event_bus_arn(config)],
                    conditions={"StringEquals": {"events:source": [AGENT_SOURCE]}},
                ),
                iam.PolicyStatement(  # the training output (each job's policy narrows it to its streams)
                    actions=["logs:CreateLogStream", "logs:PutLogEvents"],
                    resources=[f"arn:{part}:logs:{home}:{acct}:log-group:{LOG_GROUP_DEFAULT}:log-stream:*"],
                ),
            ],
        )
