"""cdk-nag AwsSolutions as a validation plugin, and acknowledgements that carry their reasons.

cdk-nag 3 reports each IAM wildcard as its own finding (``AwsSolutions-IAM5[Resource::<...>]``).
Rather than hand-copy rendered ARNs, :func:`acknowledge_wildcards` renders each policy the way cdk-nag
does (utils/flatten-cfn-reference) and acknowledges a wildcard only when a reason pattern below
explains it. A wildcard no pattern explains stays a finding and fails the synth.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from aws_cdk import Acknowledgment, App, Stack, Validations
from aws_cdk import aws_iam as iam
from cdk_nag import AwsSolutionsChecks
from constructs import Construct, IConstruct

# (regex on the finding, reason). First match wins.
WILDCARD_REASONS: tuple[tuple[str, str], ...] = (
    (
        r"^Action::s3:(GetObject|GetBucket|List|DeleteObject|Abort)\*$",
        "CDK bucket grant action groups; the resource is limited to one bucket and one key prefix",
    ),
    (
        r"^Action::kms:(GenerateDataKey|ReEncrypt)\*$",
        "CDK key grant action groups; the resource is the one customer-managed key of this stack",
    ),
    (
        r"^Resource::<[A-Za-z0-9]+\.Arn>/index/\*$",
        "queries on the table's own global secondary indexes (by-status, by-instance)",
    ),
    (
        r"^Resource::(<[A-Za-z0-9]+\.Arn>|arn:<AWS::Partition>:s3:::[A-Za-z0-9<>:.-]+)/[a-z]+(/[a-z]+)*/\*$",
        "object access limited to one key prefix (checkpoints/, data/, submissions/...) of one bucket",
    ),
    (
        r"^Resource::(<[A-Za-z0-9]+\.Arn>|arn:<AWS::Partition>:s3:::[A-Za-z0-9<>:.-]+)/\*$",
        "every object of this one bucket: replication and log delivery, or reading a dataset bucket the "
        "deployment lists in dataset_buckets (each job's own policy names its dataset's prefix)",
    ),
    (r"^Resource::<[A-Za-z0-9]+\.Arn>:\*$", "invoke any version or alias of this one function (CDK grantInvoke)"),
    (
        r"^Resource::arn:<AWS::Partition>:states:<AWS::Region>:<AWS::AccountId>:execution:[a-z0-9-]+:\*$",
        "executions of the one job-run state machine (execution names are job ids)",
    ),
    (
        r"^Resource::arn:<AWS::Partition>:ec2:\*:<AWS::AccountId>:(instance|fleet|placement-group|volume|"
        r"network-interface|spot-instances-request|launch-template|subnet|security-group)/\*$",
        "instance ids are unknown before launch; limited by condition to the training regions "
        "(aws:RequestedRegion) and to requests and resources carrying the spotrelay:job-id tag",
    ),
    (
        r"^Resource::arn:<AWS::Partition>:ec2:\*::image/\*$",
        "the Deep Learning AMI id changes with every release; images are read-only",
    ),
    (
        r"^Resource::arn:<AWS::Partition>:ec2:\*:<AWS::AccountId>:\*/\*$",
        "CreateTags only at creation (condition ec2:CreateAction = CreateFleet/RunInstances)",
    ),
    (
        r"^Resource::arn:<AWS::Partition>:iam::<AWS::AccountId>:(role|instance-profile)/spotrelay/"
        r"[a-z0-9-]+-agent-job-\*$",
        "per-job agent roles and instance profiles, named from a hash of the job id at launch; created only "
        "with the stack's permissions boundary (iam:PermissionsBoundary) and passed only to EC2",
    ),
    (
        r"^Resource::arn:<AWS::Partition>:iam::<AWS::AccountId>:role/aws-service-role/"
        r"(spot|ec2fleet)\.amazonaws\.com/\*$",
        "the EC2 Spot / Fleet service-linked roles, created once per account on first launch",
    ),
    (
        r"^Resource::arn:<AWS::Partition>:ssm:\*:<AWS::AccountId>:parameter/[a-z0-9-]+/training/\*$",
        "the parameters this deployment's regional stacks publish (subnets, launch template), "
        "limited to the training regions by aws:RequestedRegion",
    ),
    (
        r"^Resource::arn:<AWS::Partition>:s3:::[A-Za-z0-9<>:.-]+/checkpoints/\*/manifest\.json$",
        "the checkpoints' manifests of every job (job ids and steps are not known in advance), which "
        "`spotrelay describe` and `resume` list; not their shards (cdk/cli_access.py)",
    ),
    (
        r"^Resource::arn:<AWS::Partition>:logs:[a-z0-9-]+:<AWS::AccountId>:log-group:/spotrelay/training:\*$",
        "the training log group's streams (one per job, attempt and rank), which `spotrelay logs` reads "
        "(cdk/cli_access.py)",
    ),
    (
        r"^Resource::arn:<AWS::Partition>:logs:[a-z0-9-<>:]+:log-group:[A-Za-z0-9/_.-]+:\*$",
        "log streams of this function's own log group",
    ),
    (
        r"^Resource::arn:<AWS::Partition>:logs:[A-Za-z0-9<>:-]+:log-group:/spotrelay/training:log-stream:\*$",
        "the training nodes' output: one stream per job, attempt and node, named at launch; each job's own "
        "role narrows it to the job's streams (<job>/*)",
    ),
)


_LOG_DELIVERY = (
    "Step Functions vended-log delivery actions support no resource-level permissions "
    '(AWS documents Resource "*" for them)'
)
# Actions that may appear with Resource "*" and why.
STAR_RESOURCE_REASONS: tuple[tuple[str, str], ...] = (
    ("xray:", "X-Ray trace and sampling calls support no resource-level permissions"),
    ("ec2:Describe", "EC2 Describe* calls support no resource-level permissions"),
    ("ec2:GetSpotPlacementScores", "GetSpotPlacementScores supports no resource-level permissions (read-only)"),
    (
        "iam:ListRoles",
        "ListRoles supports no resource-level permissions; reconcile lists the /spotrelay/ path and reads "
        "the tags of its own per-job roles only (ListRoleTags is scoped to them)",
    ),
    ("logs:CreateLogDelivery", _LOG_DELIVERY),
    ("logs:GetLogDelivery", _LOG_DELIVERY),
    ("logs:UpdateLogDelivery", _LOG_DELIVERY),
    ("logs:DeleteLogDelivery", _LOG_DELIVERY),
    ("logs:ListLogDeliveries", _LOG_DELIVERY),
    ("logs:PutResourcePolicy", _LOG_DELIVERY),
    ("logs:DescribeResourcePolicies", _LOG_DELIVERY),
    ("logs:DescribeLogGroups", _LOG_DELIVERY),
    (
        "s3:PutBucketNotification",
        "aws-cdk-lib's own bucket-notifications custom resource (enables EventBridge delivery on the jobs bucket)",
    ),
)


def flatten(node: Any) -> str:
    """Python port of cdk-nag's flattenCfnReference (how findings name resources)."""
    if node is None:
        return ""
    if isinstance(node, str):
        return node.replace("${", "<").replace("}", ">")
    if isinstance(node, dict) and len(node) == 1:
        ((key, value),) = node.items()
        if key == "Fn::Join":
            delimiter, items = value
            return str(delimiter).join(flatten(item) for item in items)
        if key == "Fn::Sub":
            return flatten(value)
        if key == "Fn::GetAtt":
            return f"<{flatten(value[0])}.{flatten(value[1])}>"
        if key == "Fn::ImportValue":
            return flatten(value)
        if key == "Ref":
            return f"<{flatten(value)}>"
    return json.dumps(node, separators=(",", ":"))


def wildcard_findings(document: dict[str, Any]) -> list[str]:
    found: list[str] = []
    for statement in document.get("Statement", []):
        if statement.get("Effect") != "Allow":
            continue
        actions = statement.get("Action", [])
        resources = statement.get("Resource", [])
        for action in actions if isinstance(actions, list) else [actions]:
            if "*" in action:
                found.append(f"Action::{action}")
        for resource in resources if isinstance(resources, list) else [resources]:
            text = flatten(resource)
            if "*" in text:
                found.append(f"Resource::{text}")
    return list(dict.fromkeys(found))


def reason_for(finding: str, document: dict[str, Any] | None = None) -> str | None:
    if finding == "Resource::*":
        return _star_reason(document or {})
    return next((reason for pattern, reason in WILDCARD_REASONS if re.search(pattern, finding)), None)


def _star_reason(document: dict[str, Any]) -> str | None:
    """A reason only when every action granted on "*" is one that cannot be scoped."""
    reasons = []
    for statement in document.get("Statement", []):
        resources = statement.get("Resource")
        if statement.get("Effect") != "Allow" or (resources != "*" and "*" not in (resources or [])):
            continue
        actions = statement.get("Action", [])
        for action in actions if isinstance(actions, list) else [actions]:
            reason = next((r for prefix, r in STAR_RESOURCE_REASONS if action.startswith(prefix)), None)
            if reason is None:
                return None
            reasons.append(reason)
    return "; ".join(dict.fromkeys(reasons)) or None


def _policies(scope: IConstruct) -> Iterable[iam.CfnPolicy | iam.CfnManagedPolicy]:
    for child in scope.node.find_all():
        if isinstance(child, (iam.CfnPolicy, iam.CfnManagedPolicy)):
            yield child


def _owner(policy: iam.CfnPolicy | iam.CfnManagedPolicy) -> IConstruct:
    """The role a policy is attached to (Role/DefaultPolicy/Resource -> Role); CDK may move part of a
    large policy into OverflowPolicyN children of the role while synthesizing. A managed policy: itself."""
    node: IConstruct = policy
    for _ in range(1 if isinstance(policy, iam.CfnManagedPolicy) else 2):
        if node.node.scope is not None:
            node = node.node.scope
    return node


def acknowledge_wildcards(scope: Construct) -> list[str]:
    """Acknowledge every explained IAM5 finding under ``scope``; return the unexplained ones."""
    unexplained = []
    for policy in _policies(scope):
        document = Stack.of(policy).resolve(policy.policy_document)
        for finding in wildcard_findings(document):
            reason = reason_for(finding, document)
            if reason is None:
                unexplained.append(f"{policy.node.path}: {finding}")
                continue
            Validations.of(_owner(policy)).acknowledge(
                Acknowledgment(id=f"AwsSolutions-IAM5[{finding}]", reason=reason)
            )
    return unexplained


def acknowledge(scope: IConstruct, rule: str, reason: str) -> None:
    Validations.of(scope).acknowledge(Acknowledgment(id=rule, reason=reason))


def acknowledge_cdk_internals(stack: Stack) -> None:
    """aws-cdk-lib's own singleton Lambdas (bucket notifications) come with the AWS-managed basic role."""
    for child in stack.node.children:
        if child.node.id.startswith("BucketNotificationsHandler"):
            acknowledge(
                child,
                "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/"
                "AWSLambdaBasicExecutionRole]",
                "aws-cdk-lib's bucket-notifications handler; its role only writes its own logs",
            )


def add_checks(app: App) -> None:
    # write_suppressions_...: acknowledgements land in each resource's Metadata (auditable, tested)
    Validations.of(app).add_plugins(AwsSolutionsChecks(app, write_suppressions_to_cloud_formation=True))
