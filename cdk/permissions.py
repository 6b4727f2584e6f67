"""What each handler may do. A handler gets only the capabilities its trigger needs.

Handlers are discovered by name (``functions/<module>.py``), so capabilities are keyed by module name
or prefix; a module not listed here gets the job store and the topic only, and a review of this table.
"""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import Aws
from aws_cdk import aws_dynamodb as ddb
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_secretsmanager as sm
from aws_cdk import aws_sns as sns

from cdk.agent_boundary import job_role_arns
from spotrelay.resources import RESOURCES

# The tag every instance spotrelay launches carries (the compute adapter sets it); terminate and
# tag-changing calls are limited to such instances.
MANAGED_TAG = "spotrelay:job-id"

STORE = "store"  # read/write the job, node, pool and idempotency tables
SUBMISSIONS = "submissions"  # read (and move) objects under submissions/
CHECKPOINTS_READ = "checkpoints-read"  # read manifests under checkpoints/
PUBLISH = "publish"  # publish to the notifications topic
EXECUTIONS = "executions"  # start, describe, list and stop job-run executions
TOKENS = "tokens"  # complete and heartbeat task tokens of job-run
EC2_READ = "ec2-read"  # describe instances, spot prices, offerings
EC2_LAUNCH = "ec2-launch"  # create fleets / run instances from our launch templates
EC2_TERMINATE = "ec2-terminate"  # terminate instances tagged by spotrelay
REGION_PARAMETERS = "region-parameters"  # read /<prefix>/training/* SSM parameters in training regions
SLACK_SECRET = "slack-secret"  # read the Slack webhook secret
PUT_EVENTS = "put-events"  # publish controller events on the home bus
AGENT_PROFILES = "agent-profiles"  # create/delete the per-job agent roles and instance profiles
AGENT_PROFILES_SWEEP = "agent-profiles-sweep"  # list the per-job agent roles (reconcile deletes leaked ones)

_CONTROLLER = frozenset({STORE, PUBLISH})
_EVENT = _CONTROLLER | {TOKENS, EC2_READ, CHECKPOINTS_READ}
CAPABILITIES: dict[str, frozenset[str]] = {
    "on_submission": _CONTROLLER | {SUBMISSIONS, EXECUTIONS},
    "on_interruption_notice": _EVENT | {EC2_LAUNCH, EC2_TERMINATE, REGION_PARAMETERS, AGENT_PROFILES},
    "on_rebalance": _EVENT | {EC2_LAUNCH, REGION_PARAMETERS, AGENT_PROFILES},
    "on_instance_state": _EVENT | {EC2_TERMINATE},
    "on_agent_event": _EVENT | {PUT_EVENTS},
    "reconcile": _EVENT | {EXECUTIONS, EC2_TERMINATE, AGENT_PROFILES, AGENT_PROFILES_SWEEP, SUBMISSIONS},
    "sfn_": _EVENT | {EC2_LAUNCH, EC2_TERMINATE, REGION_PARAMETERS, EXECUTIONS, AGENT_PROFILES},
    "slack_notifier": frozenset({SLACK_SECRET}),
}


@dataclass(frozen=True)
class Grants:
    """The resources capabilities refer to."""

    tables: dict[str, ddb.ITable]
    bucket: s3.IBucket
    topic: sns.ITopic
    state_machine_name: str
    slack_secret: sm.ISecret
    prefix: str
    training_regions: tuple[str, ...]
    agent_boundary_arn: str = ""  # the managed policy every per-job agent role must carry (agent_boundary)


@dataclass(frozen=True)
class GrantSet:
    capabilities: frozenset[str]

    def apply(self, role: iam.IRole, g: Grants) -> None:
        caps = self.capabilities
        if STORE in caps:
            for table in g.tables.values():
                table.grant_read_write_data(role)
        if SUBMISSIONS in caps:
            g.bucket.grant_read_write(role, f"{RESOURCES.submissions_prefix}*")
        if CHECKPOINTS_READ in caps:
            g.bucket.grant_read(role, f"{RESOURCES.checkpoints_prefix}*")
        if PUBLISH in caps:
            g.topic.grant_publish(role)
        if SLACK_SECRET in caps:
            g.slack_secret.grant_read(role)
        sm_arn = state_machine_arn(g.state_machine_name)
        execution_arn = f"arn:{Aws.PARTITION}:states:{Aws.REGION}:{Aws.ACCOUNT_ID}:execution:{g.state_machine_name}:*"
        statements: list[iam.PolicyStatement] = []
        if EXECUTIONS in caps:
            statements.append(
                iam.PolicyStatement(actions=["states:StartExecution", "states:ListExecutions"], resources=[sm_arn])
            )
            statements.append(
                iam.PolicyStatement(
                    actions=["states:DescribeExecution", "states:StopExecution"], resources=[execution_arn]
                )
            )
        if TOKENS in caps:
            statements.append(
                iam.PolicyStatement(
                    actions=["states:SendTaskSuccess", "states:SendTaskFailure", "states:SendTaskHeartbeat"],
                    resources=[sm_arn],
                )
            )
        if EC2_READ in caps:
            statements.append(
                iam.PolicyStatement(
                    actions=[
                        "ec2:DescribeInstances",
                        "ec2:DescribeInstanceStatus",
                        "ec2:DescribeSpotPriceHistory",
                        "ec2:DescribeInstanceTypeOfferings",
                        "ec2:DescribeAvailabilityZones",
                        "ec2:DescribeFleets",
                        "ec2:DescribeFleetInstances",
                        "ec2:DescribeLaunchTemplates",
                        "ec2:DescribeSubnets",
                        "ec2:DescribePlacementGroups",
                        "ec2:DescribeLaunchTemplateVersions",
                    ],
                    resources=["*"],
                )
            )
        if EC2_LAUNCH in caps:
            statements.extend(_launch_statements(g))
        if EC2_TERMINATE in caps:
            statements.append(
                iam.PolicyStatement(
                    actions=[
                        "ec2:TerminateInstances",
                        "ec2:DeleteFleets",
                        "ec2:DeletePlacementGroup",
                        "ec2:DeleteLaunchTemplate",
                    ],
                    resources=[
                        f"arn:{Aws.PARTITION}:ec2:*:{Aws.ACCOUNT_ID}:{kind}/*"
                        for kind in ("instance", "fleet", "placement-group", "launch-template")
                    ],
                    conditions={"Null": {f"aws:ResourceTag/{MANAGED_TAG}": "false"}, **_in_regions(g)},
                )
            )
        if AGENT_PROFILES in caps:
            statements.extend(_agent_profile_statements(g))
        if AGENT_PROFILES_SWEEP in caps:
            statements.append(iam.PolicyStatement(actions=["iam:ListRoles"], resources=["*"]))
            statements.append(iam.PolicyStatement(actions=["iam:ListRoleTags"], resources=[job_role_arns(g.prefix)[0]]))
        if REGION_PARAMETERS in caps:
            statements.append(
                iam.PolicyStatement(
                    actions=["ssm:GetParameter", "ssm:GetParameters", "ssm:GetParametersByPath"],
                    resources=[f"arn:{Aws.PARTITION}:ssm:*:{Aws.ACCOUNT_ID}:parameter/{g.prefix}/training/*"],
                    conditions=_in_regions(g),
                )
            )
        if PUT_EVENTS in caps:
            statements.append(
                iam.PolicyStatement(
                    actions=["events:PutEvents"],
                    resources=[f"arn:{Aws.PARTITION}:events:{Aws.REGION}:{Aws.ACCOUNT_ID}:event-bus/default"],
                    conditions={"StringEquals": {"events:source": ["spotrelay.controller"]}},
                )
            )
        for statement in statements:
            role.add_to_principal_policy(statement)


def _launch_statements(g: Grants) -> list[iam.PolicyStatement]:
    """Launch from our templates only, tag at launch only, pass only the agent roles."""
    acct = Aws.ACCOUNT_ID
    part = Aws.PARTITION
    return [
        iam.PolicyStatement(
            actions=["ec2:CreateFleet", "ec2:RunInstances", "ec2:CreatePlacementGroup", "ec2:CreateLaunchTemplate"],
            resources=[
                f"arn:{part}:ec2:*:{acct}:{kind}/*"
                for kind in (
                    "instance",
                    "fleet",
                    "placement-group",
                    "volume",
                    "network-interface",
                    "spot-instances-request",
                    "launch-template",
                )
            ],
            conditions={"Null": {f"aws:RequestTag/{MANAGED_TAG}": "false"}, **_in_regions(g)},
        ),
        iam.PolicyStatement(
            actions=["ec2:CreateFleet", "ec2:RunInstances"],
            resources=[f"arn:{part}:ec2:*:{acct}:{kind}/*" for kind in ("launch-template", "subnet", "security-group")]
            + [f"arn:{part}:ec2:*::image/*"],
            conditions=_in_regions(g),
        ),
        iam.PolicyStatement(
            actions=["ec2:CreateTags"],
            resources=[f"arn:{part}:ec2:*:{acct}:*/*"],
            conditions={
                "StringEquals": {
                    "ec2:CreateAction": ["CreateFleet", "RunInstances", "CreatePlacementGroup", "CreateLaunchTemplate"],
                    "aws:RequestedRegion": list(g.training_regions),
                }
            },
        ),
        # rank and Name tags go on after launch, only onto instances this controller launched
        iam.PolicyStatement(
            actions=["ec2:CreateTags"],
            resources=[f"arn:{part}:ec2:*:{acct}:instance/*"],
            conditions={"Null": {f"aws:ResourceTag/{MANAGED_TAG}": "false"}, **_in_regions(g)},
        ),
        # only the per-job agent roles (launch, and AddRoleToInstanceProfile, need PassRole)
        iam.PolicyStatement(
            actions=["iam:PassRole"],
            resources=[job_role_arns(g.prefix)[0]],
            conditions={"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}},
        ),
        iam.PolicyStatement(
            actions=["iam:CreateServiceLinkedRole"],
            resources=[
                f"arn:{part}:iam::{acct}:role/aws-service-role/spot.amazonaws.com/*",
                f"arn:{part}:iam::{acct}:role/aws-service-role/ec2fleet.amazonaws.com/*",
            ],
            conditions={"StringLike": {"iam:AWSServiceName": ["spot.amazonaws.com", "ec2fleet.amazonaws.com"]}},
        ),
    ]


def _agent_profile_statements(g: Grants) -> list[iam.PolicyStatement]:
    """Per-job agent roles (spotrelay/adapters/iam_job_profile.py): created and given a policy only with
    the stack's permissions boundary, so the controller cannot mint a role beyond what agents need."""
    roles, profiles = job_role_arns(g.prefix)
    if not g.agent_boundary_arn:
        raise ValueError("agent-profiles needs Grants.agent_boundary_arn")
    return [
        iam.PolicyStatement(
            actions=["iam:CreateRole", "iam:PutRolePolicy"],
            resources=[roles],
            conditions={"StringEquals": {"iam:PermissionsBoundary": g.agent_boundary_arn}},
        ),
        iam.PolicyStatement(
            actions=["iam:GetRole", "iam:TagRole", "iam:DeleteRolePolicy", "iam:DeleteRole"], resources=[roles]
        ),
        iam.PolicyStatement(
            actions=[
                "iam:CreateInstanceProfile",
                "iam:GetInstanceProfile",
                "iam:AddRoleToInstanceProfile",
                "iam:RemoveRoleFromInstanceProfile",
                "iam:DeleteInstanceProfile",
            ],
            resources=[profiles],
        ),
    ]


def _in_regions(g: Grants) -> dict[str, object]:
    # one ARN with a region wildcard plus this condition keeps policies small (CDK would split them)
    return {"StringEquals": {"aws:RequestedRegion": list(g.training_regions)}}


def state_machine_arn(name: str) -> str:
    # Built from the name, not referenced: the machine's definition refers to the functions, so a
    # reference back from their roles and environment would be a cycle.
    return f"arn:{Aws.PARTITION}:states:{Aws.REGION}:{Aws.ACCOUNT_ID}:stateMachine:{name}"


def grants_for(module: str) -> GrantSet:
    if module in CAPABILITIES:
        return GrantSet(CAPABILITIES[module])
    for key, caps in CAPABILITIES.items():
        if key.endswith("_") and module.startswith(key):
            return GrantSet(caps)
    return GrantSet(_CONTROLLER)
