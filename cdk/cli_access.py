"""The managed policies a deployment gives the people who run the CLI.

The CLI calls AWS as whoever runs it. Each command's calls are listed here once, as (action, where it
acts). The home stack turns that list into two managed policies: ``<prefix>-cli-user`` holds every
command, and ``<prefix>-cli-viewer`` holds the commands that only read. Attach one to a person's role.
Each resource is this deployment's own: its two tables, the by-status index, two key prefixes of the
jobs bucket and its checkpoints' manifests (not their shards), the training log group and the
job-run state machine. Nothing is granted on ``*``.

The list is checked both ways. tests/infrastructure/test_cli_permissions.py compares it with what each
command's code can call, and with docs/security.md's table. tests/integration/test_cli_policies.py runs
each command against moto with IAM enforced, under each policy.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from aws_cdk import Aws
from aws_cdk import aws_iam as iam
from constructs import Construct

from cdk.agent_boundary import checkpoint_buckets
from cdk.config import AppConfig
from cdk.storage import jobs_bucket_name, table_name
from spotrelay.ports.logs import LOG_GROUP_DEFAULT
from spotrelay.resources import JOBS, NODES, RESOURCES

_GET, _PUT, _LIST = "s3:GetObject", "s3:PutObject", "s3:ListBucket"
_READ_JOB = {("dynamodb:GetItem", "jobs"), ("dynamodb:Query", "nodes")}
# command -> (IAM action, scope). Scopes are the resources of Deployment.arns.
COMMANDS: dict[str, frozenset[tuple[str, str]]] = {
    # ListBucket: without it, S3 answers the HeadObject of a code archive not yet uploaded with 403, not 404
    "submit": frozenset({(_PUT, "submissions"), (_PUT, "code"), (_GET, "code"), (_LIST, "bucket")}),
    # a live job past its first attempt: its ranks still saving count in its cost (the nodes table)
    "jobs": frozenset({("dynamodb:Scan", "jobs"), ("dynamodb:Query", "status_index"), ("dynamodb:Query", "nodes")}),
    "status": frozenset(_READ_JOB),
    "cost": frozenset(_READ_JOB),
    "describe": frozenset(_READ_JOB | {(_LIST, "bucket"), (_LIST, "checkpoint_buckets"),
                                       (_GET, "manifests")}),  # the checkpoints' manifests
    "logs": frozenset({("logs:DescribeLogStreams", "training_logs"), ("logs:GetLogEvents", "training_logs")}),
    # a conditional write of the job; the workflow woken; with --save, each rank's save directive
    "cancel": frozenset({("dynamodb:GetItem", "jobs"), ("dynamodb:PutItem", "jobs"),
                         ("states:SendTaskFailure", "state_machine"), ("dynamodb:Query", "nodes"),
                         ("dynamodb:GetItem", "nodes"), ("dynamodb:PutItem", "nodes")}),
    # the scan: no other live job may write to the same checkpoints (it must see every job once)
    "resume": frozenset({("dynamodb:GetItem", "jobs"), ("dynamodb:Scan", "jobs"), (_LIST, "bucket"),
                         (_LIST, "checkpoint_buckets"),
                         (_GET, "manifests"), (_PUT, "submissions"), (_PUT, "code"), (_GET, "code")}),
}
# policy -> the commands it allows
POLICIES: dict[str, tuple[str, ...]] = {
    "cli-user": tuple(COMMANDS),
    "cli-viewer": ("jobs", "status", "cost", "describe", "logs"),
}


@dataclass(frozen=True)
class Deployment:
    """Where the CLI's calls land: plain names (a test's moto) or CloudFormation tokens (the stack)."""

    partition: str
    account: str
    region: str
    bucket: str
    jobs_table: str
    nodes_table: str
    state_machine: str
    log_group: str = LOG_GROUP_DEFAULT
    # the training regions' data buckets: a job's checkpoint.s3_prefix may be there (their manifests)
    data_buckets: tuple[str, ...] = ()

    def arns(self, scope: str) -> list[str]:
        table = f"arn:{self.partition}:dynamodb:{self.region}:{self.account}:table/"
        bucket = f"arn:{self.partition}:s3:::{self.bucket}"
        data = [f"arn:{self.partition}:s3:::{b}" for b in self.data_buckets]
        logs = f"arn:{self.partition}:logs:{self.region}:{self.account}:log-group:{self.log_group}"
        return {
            "jobs": [table + self.jobs_table],
            "status_index": [f"{table}{self.jobs_table}/index/by-status"],  # (the adapter's `jobs --status`)
            "nodes": [table + self.nodes_table],
            "bucket": [bucket],
            "checkpoint_buckets": data,  # (listing a data bucket's checkpoints, for describe and resume)
            "submissions": [f"{bucket}/{RESOURCES.submissions_prefix}*"],
            "code": [f"{bucket}/{RESOURCES.code_prefix}*"],
            # the manifests only: listing and resuming read no shard, and a viewer gets no weights
            "manifests": [f"{b}/{RESOURCES.checkpoints_prefix}*/manifest.json" for b in (bucket, *data)],
            # DescribeLogStreams acts on the group, GetLogEvents on its streams (log-group:NAME:log-stream:S)
            "training_logs": [logs, f"{logs}:*"],
            "state_machine": [f"arn:{self.partition}:states:{self.region}:{self.account}:stateMachine:"
                              f"{self.state_machine}"],
        }[scope]


def statements(commands: Iterable[str], where: Deployment) -> list[dict[str, Any]]:
    """The Allow statements for ``commands``: one per set of actions, on every resource those act on."""
    actions: dict[str, set[str]] = {}
    for command in commands:
        if command not in COMMANDS:
            raise ValueError(f"cdk/cli_access.py: no command {command!r} (known: {', '.join(COMMANDS)})")
        for action, scope in COMMANDS[command]:
            actions.setdefault(scope, set()).add(action)
    resources: dict[tuple[str, ...], list[str]] = {}
    for scope in sorted(actions):
        resources.setdefault(tuple(sorted(actions[scope])), []).extend(where.arns(scope))
    return [{"Effect": "Allow", "Action": list(acts), "Resource": res} for acts, res in sorted(resources.items())]


def document(policy: str, where: Deployment) -> dict[str, Any]:
    """The IAM policy document of ``policy`` (a key of POLICIES)."""
    return {"Version": "2012-10-17", "Statement": statements(POLICIES[policy], where)}


def logical_id(policy: str) -> str:
    """``cli-user`` -> ``CliUser`` (the construct's id; the stack's output adds ``PolicyArn``)."""
    return "".join(part.title() for part in policy.split("-"))


def home_deployment(config: AppConfig, state_machine: str) -> Deployment:
    """The home stack's resources, by the names it gives them."""
    return Deployment(partition=Aws.PARTITION, account=Aws.ACCOUNT_ID, region=config.home_region,
                      bucket=jobs_bucket_name(config, config.home_region), jobs_table=table_name(config, JOBS),
                      nodes_table=table_name(config, NODES), state_machine=state_machine,
                      data_buckets=tuple(checkpoint_buckets(config)[1:]))


class CliPolicies(Construct):
    """``<prefix>-cli-user`` and ``<prefix>-cli-viewer``: what a person needs to run the CLI."""

    def __init__(self, scope: Construct, id: str, *, config: AppConfig, state_machine: str) -> None:
        super().__init__(scope, id)
        where = home_deployment(config, state_machine)
        self.policies = {
            name: iam.ManagedPolicy(
                self, logical_id(name),
                managed_policy_name=config.resource_name(name),
                description=f"spotrelay: what a person needs to run {', '.join(POLICIES[name])} (the CLI)",
                document=iam.PolicyDocument.from_json(document(name, where)),
            )
            for name in POLICIES
        }
