"""What each handler may do: exactly the AWS actions its code can call, each on the narrowest resource.

:data:`ACTIONS` lists, per ``functions/<module>.py``, the IAM actions of every AWS call its code path can
make (through the adapters it builds), including the ones AWS checks along with a call (tag on create,
``iam:PassRole`` on launch, KMS for the encrypted topic). tests/infrastructure/test_grants.py reads the
code, derives the same list and fails, naming the action and the handler, when they differ. Where each
action may act (tables, one bucket prefix, tagged instances in the training regions, the per-job agent
roles) is decided once, per action, in :meth:`Grants.statements`. A handler missing here gets nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from aws_cdk import Aws
from aws_cdk import aws_dynamodb as ddb
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_secretsmanager as sm
from aws_cdk import aws_sns as sns

from cdk.agent_boundary import job_role_arns
from spotrelay.resources import RESOURCES

# The tag every instance spotrelay launches carries (the compute adapter sets it); terminate and
# tag-changing calls are limited to such instances.
MANAGED_TAG = "spotrelay:job-id"

# Groups of actions that travel together (one adapter method each); ACTIONS below composes them.
IDEMPOTENCY = frozenset({"dynamodb:PutItem", "dynamodb:GetItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem"})
NOTIFY = frozenset({"sns:Publish", "kms:GenerateDataKey", "kms:Decrypt"})  # the topic is KMS-encrypted
MARKET = frozenset({"ec2:DescribeSpotPriceHistory", "ec2:DescribeAvailabilityZones", "ec2:GetSpotPlacementScores",
                    "dynamodb:BatchGetItem"})  # pool stats
TERMINATE = frozenset({"ec2:DescribeInstances", "ec2:TerminateInstances"})
TEARDOWN = TERMINATE | {
    "ec2:DescribePlacementGroups", "ec2:DeletePlacementGroup",
    "iam:RemoveRoleFromInstanceProfile", "iam:DeleteInstanceProfile", "iam:DeleteRolePolicy", "iam:DeleteRole",
}
LAUNCH = TERMINATE | {
    # discovery of the region's subnets, security group, launch template and AMI
    "ssm:GetParameters", "ec2:DescribeLaunchTemplateVersions", "ec2:DescribeSubnets",
    "ec2:DescribeSecurityGroups", "ec2:DescribeImages",
    # the per-job agent role and instance profile
    "iam:CreateRole", "iam:TagRole", "iam:PutRolePolicy", "iam:CreateInstanceProfile",
    "iam:GetInstanceProfile", "iam:AddRoleToInstanceProfile", "iam:PassRole",
    # the gang itself
    "ec2:CreatePlacementGroup", "ec2:CreateLaunchTemplate", "ec2:DeleteLaunchTemplate", "ec2:CreateFleet",
    "ec2:RunInstances", "ec2:CreateTags", "iam:CreateServiceLinkedRole",
}
_READ = frozenset({"dynamodb:GetItem", "dynamodb:Query"})
_WRITE = frozenset({"dynamodb:PutItem"})

ACTIONS: dict[str, frozenset[str]] = {
    # ListBucket: a listing of the one key tells a submission deleted before it was read from a denial
    # (S3 answers 403 for a missing key to a role whose listing is conditioned: adapters/s3_object_store.py)
    "on_submission": frozenset({"dynamodb:GetItem", "s3:GetObject", "s3:PutObject", "s3:ListBucket",
                                "states:StartExecution"}) | _WRITE | NOTIFY,
    "on_agent_event": IDEMPOTENCY | _READ | NOTIFY | {"states:SendTaskSuccess", "states:SendTaskHeartbeat",
                                                      "ec2:TerminateInstances",  # releases a drained rank
                                                      # ends a stop once its ranks saved (services/stop.py)
                                                      "states:SendTaskFailure"},
    "on_instance_state": IDEMPOTENCY | _READ | NOTIFY | {"states:SendTaskSuccess",
                                                          "ec2:DescribeInstances"},  # a loss's StateReason
    "on_interruption_notice": IDEMPOTENCY | _READ | NOTIFY | {"states:SendTaskSuccess"},
    "on_rebalance": IDEMPOTENCY | _READ | {"states:SendTaskSuccess"},  # asks the workflow for a standby
    "reconcile": IDEMPOTENCY | _READ | NOTIFY | TEARDOWN | {
        "iam:ListRoles", "iam:ListRoleTags",  # the sweep of leaked per-job roles
        "states:DescribeExecution", "states:StopExecution", "states:SendTaskSuccess", "states:SendTaskFailure",
        "s3:GetObject", "s3:PutObject", "s3:ListBucket",  # heals stuck submissions (services/submit.py)
        "states:StartExecution",
        "ec2:DescribeSpotPriceHistory",  # a budget's open attempt at its price in effect (services/budget.py)
    },
    "sfn_plan": _READ | _WRITE | MARKET | {"ec2:TerminateInstances"},  # releases survivors it drops
    "sfn_provision": _READ | _WRITE | {"dynamodb:UpdateItem"} | LAUNCH  # the only task that launches
    | {"ec2:DescribeSpotPriceHistory"},  # a move closes the old attempt at the price in effect
    "sfn_register_wait": _READ | _WRITE | NOTIFY | {"states:SendTaskSuccess", "states:SendTaskFailure"},
    "sfn_recover": _READ | _WRITE | {"dynamodb:UpdateItem"} | MARKET | TERMINATE | NOTIFY,
    "sfn_review": _READ | MARKET,  # decides only: Migrate (sfn_provision) launches and writes
    "sfn_teardown": _READ | _WRITE | TEARDOWN,
    # starts the job's next execution before this one's history fills (services/handover.py)
    "sfn_handover": frozenset({"dynamodb:GetItem"}) | _WRITE | {"states:StartExecution",
                                                               "states:StopExecution"},  # (one it cannot record)
    "sfn_finalize": frozenset({"dynamodb:GetItem"}) | _WRITE | NOTIFY
    | {"ec2:DescribeSpotPriceHistory"},  # the last attempt closes at the price in effect
    "slack_notifier": frozenset({"secretsmanager:GetSecretValue"}),
}
# Key prefixes of the jobs bucket a handler's S3 object actions may touch (and its listings name).
S3_PREFIXES: dict[str, tuple[str, ...]] = {
    "on_submission": (RESOURCES.submissions_prefix,),
    "reconcile": (RESOURCES.submissions_prefix,),
}
# What the Lambda service itself needs (logs, traces), granted to every function in cdk/functions.py.
PLATFORM = frozenset({"logs:CreateLogStream", "logs:PutLogEvents", "xray:PutTraceSegments", "xray:PutTelemetryRecords"})


@dataclass(frozen=True)
class Grants:
    """The resources the actions act on."""

    tables: dict[str, ddb.ITable]
    bucket: s3.IBucket
    topic: sns.ITopic
    state_machine_name: str
    slack_secret: sm.ISecret
    prefix: str
    training_regions: tuple[str, ...]
    agent_boundary_arn: str = ""  # the managed policy every per-job agent role must carry (agent_boundary)
    topic_key: kms.IKey | None = None  # the key the topic is encrypted with

    def statements(self, module: str, actions: frozenset[str]) -> list[iam.PolicyStatement]:
        """One statement per resource scope, holding the given actions that act there."""
        by_scope: dict[str, list[str]] = {}
        for action in sorted(actions):
            scope = next((name for name, match in _SCOPES if match(action)), None)
            if scope is None:
                raise ValueError(f"cdk/permissions.py: no resource scope for {action} ({module}); add one to _SCOPES")
            by_scope.setdefault(scope, []).append(action)
        out: list[iam.PolicyStatement] = []
        for scope, acts in by_scope.items():
            out.extend(getattr(self, f"_{scope}")(module, acts))
        return out

    # --- scopes ----------------------------------------------------------------------------------
    def _tables(self, module: str, acts: list[str]) -> list[iam.PolicyStatement]:
        arns = [a for t in self.tables.values() for a in (t.table_arn, f"{t.table_arn}/index/*")]
        return [iam.PolicyStatement(actions=acts, resources=arns)]

    def _objects(self, module: str, acts: list[str]) -> list[iam.PolicyStatement]:
        if module not in S3_PREFIXES:
            raise ValueError(f"cdk/permissions.py: {module} calls {acts}; name its key prefixes in S3_PREFIXES")
        return [iam.PolicyStatement(actions=acts, resources=[self.bucket.arn_for_objects(f"{p}*")
                                                             for p in S3_PREFIXES[module]])]

    def _listing(self, module: str, acts: list[str]) -> list[iam.PolicyStatement]:
        if module not in S3_PREFIXES:
            raise ValueError(f"cdk/permissions.py: {module} lists the bucket; name its key prefixes in S3_PREFIXES")
        return [iam.PolicyStatement(actions=acts, resources=[self.bucket.bucket_arn], conditions={
            "StringLike": {"s3:prefix": [f"{p}*" for p in S3_PREFIXES[module]]}})]

    def _executions(self, module: str, acts: list[str]) -> list[iam.PolicyStatement]:
        machine = [a for a in acts if a in ("states:StartExecution", "states:ListExecutions") or "Task" in a]
        execution = f"arn:{Aws.PARTITION}:states:{Aws.REGION}:{Aws.ACCOUNT_ID}:execution:{self.state_machine_name}:*"
        rest = [a for a in acts if a not in machine]
        return [iam.PolicyStatement(actions=group, resources=[resource]) for group, resource in (
            (machine, state_machine_arn(self.state_machine_name)), (rest, execution)) if group]

    def _describe(self, module: str, acts: list[str]) -> list[iam.PolicyStatement]:
        return [iam.PolicyStatement(actions=acts, resources=["*"])]  # no resource-level permissions

    def _launch(self, module: str, acts: list[str]) -> list[iam.PolicyStatement]:
        """Launch from our templates only, tagged at launch only, in the training regions only."""
        part, acct = Aws.PARTITION, Aws.ACCOUNT_ID
        kinds = ("instance", "fleet", "placement-group", "volume", "network-interface", "spot-instances-request",
                 "launch-template")
        out = [iam.PolicyStatement(
            actions=acts, resources=[f"arn:{part}:ec2:*:{acct}:{kind}/*" for kind in kinds],
            conditions={"Null": {f"aws:RequestTag/{MANAGED_TAG}": "false"}, **self._in_regions()},
        )]
        fleet = [a for a in acts if a in ("ec2:CreateFleet", "ec2:RunInstances")]
        if fleet:
            out.append(iam.PolicyStatement(
                actions=fleet,
                resources=[f"arn:{part}:ec2:*:{acct}:{kind}/*" for kind in ("launch-template", "subnet",
                                                                             "security-group")]
                + [f"arn:{part}:ec2:*::image/*"],
                conditions=self._in_regions(),
            ))
        return out

    def _tags(self, module: str, acts: list[str]) -> list[iam.PolicyStatement]:
        part, acct = Aws.PARTITION, Aws.ACCOUNT_ID
        return [
            iam.PolicyStatement(actions=acts, resources=[f"arn:{part}:ec2:*:{acct}:*/*"], conditions={"StringEquals": {
                "ec2:CreateAction": ["CreateFleet", "RunInstances", "CreatePlacementGroup", "CreateLaunchTemplate"],
                "aws:RequestedRegion": list(self.training_regions)}}),
            # rank and Name tags go on after launch, only onto instances this controller launched
            iam.PolicyStatement(actions=acts, resources=[f"arn:{part}:ec2:*:{acct}:instance/*"],
                                conditions={"Null": {f"aws:ResourceTag/{MANAGED_TAG}": "false"}, **self._in_regions()}),
        ]

    def _managed(self, module: str, acts: list[str]) -> list[iam.PolicyStatement]:
        kinds = ("instance", "fleet", "placement-group", "launch-template")
        return [iam.PolicyStatement(
            actions=acts, resources=[f"arn:{Aws.PARTITION}:ec2:*:{Aws.ACCOUNT_ID}:{kind}/*" for kind in kinds],
            conditions={"Null": {f"aws:ResourceTag/{MANAGED_TAG}": "false"}, **self._in_regions()},
        )]

    def _pass_role(self, module: str, acts: list[str]) -> list[iam.PolicyStatement]:
        # only the per-job agent roles (launch, and AddRoleToInstanceProfile, need PassRole), only to EC2
        return [iam.PolicyStatement(actions=acts, resources=[job_role_arns(self.prefix)[0]],
                                    conditions={"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}})]

    def _service_linked(self, module: str, acts: list[str]) -> list[iam.PolicyStatement]:
        part, acct = Aws.PARTITION, Aws.ACCOUNT_ID
        return [iam.PolicyStatement(
            actions=acts,
            resources=[f"arn:{part}:iam::{acct}:role/aws-service-role/{s}/*"
                       for s in ("spot.amazonaws.com", "ec2fleet.amazonaws.com")],
            conditions={"StringLike": {"iam:AWSServiceName": ["spot.amazonaws.com", "ec2fleet.amazonaws.com"]}},
        )]

    def _role_create(self, module: str, acts: list[str]) -> list[iam.PolicyStatement]:
        """Per-job agent roles are created and given a policy only with the agents' permissions boundary,
        so the controller cannot mint a role beyond what agents need (cdk/agent_boundary.py)."""
        if not self.agent_boundary_arn:
            raise ValueError(f"{module} creates agent roles: Grants.agent_boundary_arn is required")
        return [iam.PolicyStatement(actions=acts, resources=[job_role_arns(self.prefix)[0]],
                                    conditions={"StringEquals": {"iam:PermissionsBoundary": self.agent_boundary_arn}})]

    def _roles(self, module: str, acts: list[str]) -> list[iam.PolicyStatement]:
        return [iam.PolicyStatement(actions=acts, resources=[job_role_arns(self.prefix)[0]])]

    def _profiles(self, module: str, acts: list[str]) -> list[iam.PolicyStatement]:
        return [iam.PolicyStatement(actions=acts, resources=[job_role_arns(self.prefix)[1]])]

    def _list_roles(self, module: str, acts: list[str]) -> list[iam.PolicyStatement]:
        return [iam.PolicyStatement(actions=acts, resources=["*"])]  # ListRoles has no resource-level permissions

    def _parameters(self, module: str, acts: list[str]) -> list[iam.PolicyStatement]:
        return [iam.PolicyStatement(
            actions=acts, resources=[f"arn:{Aws.PARTITION}:ssm:*:{Aws.ACCOUNT_ID}:parameter/{self.prefix}/training/*"],
            conditions=self._in_regions(),
        )]

    def _events(self, module: str, acts: list[str]) -> list[iam.PolicyStatement]:
        return [iam.PolicyStatement(
            actions=acts, resources=[f"arn:{Aws.PARTITION}:events:{Aws.REGION}:{Aws.ACCOUNT_ID}:event-bus/default"],
            conditions={"StringEquals": {"events:source": ["spotrelay.controller"]}},
        )]

    def _topic(self, module: str, acts: list[str]) -> list[iam.PolicyStatement]:
        return [iam.PolicyStatement(actions=acts, resources=[self.topic.topic_arn])]

    def _topic_key(self, module: str, acts: list[str]) -> list[iam.PolicyStatement]:
        if self.topic_key is None:
            raise ValueError(f"{module} publishes to the encrypted topic: Grants.topic_key is required")
        return [iam.PolicyStatement(actions=acts, resources=[self.topic_key.key_arn])]

    def _secret(self, module: str, acts: list[str]) -> list[iam.PolicyStatement]:
        return [iam.PolicyStatement(actions=acts, resources=[self.slack_secret.secret_arn])]

    def _in_regions(self) -> dict[str, object]:
        # one ARN with a region wildcard plus this condition keeps policies small (CDK would split them)
        return {"StringEquals": {"aws:RequestedRegion": list(self.training_regions)}}


def _in(*names: str) -> Callable[[str], bool]:
    return lambda action: action in names


# (scope, which actions act there); first match wins. Scope "x" is built by Grants._x.
_SCOPES: tuple[tuple[str, Callable[[str], bool]], ...] = (
    ("tables", lambda a: a.startswith("dynamodb:")),
    ("objects", _in("s3:GetObject", "s3:PutObject", "s3:DeleteObject")),
    ("listing", _in("s3:ListBucket")),
    ("executions", lambda a: a.startswith("states:")),
    ("describe", lambda a: a.startswith("ec2:Describe") or a == "ec2:GetSpotPlacementScores"),
    ("launch", _in("ec2:CreateFleet", "ec2:RunInstances", "ec2:CreatePlacementGroup", "ec2:CreateLaunchTemplate")),
    ("tags", _in("ec2:CreateTags")),
    ("managed", _in("ec2:TerminateInstances", "ec2:DeleteFleets", "ec2:DeletePlacementGroup",
                    "ec2:DeleteLaunchTemplate")),
    ("pass_role", _in("iam:PassRole")),
    ("service_linked", _in("iam:CreateServiceLinkedRole")),
    ("role_create", _in("iam:CreateRole", "iam:PutRolePolicy")),
    ("roles", _in("iam:GetRole", "iam:TagRole", "iam:DeleteRolePolicy", "iam:DeleteRole", "iam:ListRoleTags")),
    ("profiles", lambda a: a.startswith("iam:") and "InstanceProfile" in a),
    ("list_roles", _in("iam:ListRoles")),
    ("parameters", lambda a: a.startswith("ssm:GetParameter")),
    ("events", _in("events:PutEvents")),
    ("topic", _in("sns:Publish")),
    ("topic_key", _in("kms:GenerateDataKey", "kms:Decrypt")),
    ("secret", _in("secretsmanager:GetSecretValue")),
)


def state_machine_arn(name: str) -> str:
    # Built from the name, not referenced: the machine's definition refers to the functions, so a
    # reference back from their roles and environment would be a cycle.
    return f"arn:{Aws.PARTITION}:states:{Aws.REGION}:{Aws.ACCOUNT_ID}:stateMachine:{name}"


def actions_for(module: str) -> frozenset[str]:
    return ACTIONS.get(module, frozenset())


def grant(role: iam.IRole, module: str, grants: Grants) -> None:
    for statement in grants.statements(module, actions_for(module)):
        role.add_to_principal_policy(statement)
