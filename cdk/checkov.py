"""checkov findings we accept, each with its reason, written into the templates (like cdk-nag's).

checkov reads per-resource skips from a resource's ``Metadata.checkov.skip`` (``id`` + ``comment``).
:data:`ACCEPTED` is the one place they are decided: a rule id, the resources it applies to, and why.
An aspect writes them at synth; tests/infrastructure/test_checks.py runs the pinned checkov on the
templates and fails on any finding not accepted here, and on an acceptance that no longer matches.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import jsii
from aws_cdk import Aspects, CfnResource, IAspect
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sqs as sqs
from constructs import IConstruct

SKIP_KEY = "checkov"


@dataclass(frozen=True)
class Accepted:
    rule: str
    applies: Callable[[CfnResource], bool]
    reason: str


def _ours(node: CfnResource) -> bool:
    return isinstance(node, lambda_.CfnFunction) and str(node.handler or "").startswith("functions.")


def _cdk_internal_function(node: CfnResource) -> bool:
    return node.cfn_resource_type == "AWS::Lambda::Function" and "BucketNotificationsHandler" in node.node.path


def _access_log_bucket(node: CfnResource) -> bool:
    return isinstance(node, s3.CfnBucket) and node.node.scope is not None and node.node.scope.node.id == "AccessLogs"


def _sse_sqs_queue(node: CfnResource) -> bool:
    return isinstance(node, sqs.CfnQueue) and node.kms_master_key_id is None and node.sqs_managed_sse_enabled is True


def _type(cfn_type: str) -> Callable[[CfnResource], bool]:
    return lambda node: node.cfn_resource_type == cfn_type


_CDK_HANDLER = ("aws-cdk-lib's own bucket-notifications handler, a CloudFormation custom resource that runs only "
                "while a stack deploys and holds no data")
ACCEPTED: tuple[Accepted, ...] = (
    Accepted("CKV_AWS_116", _ours,
             "a function-level DLQ only keeps failed asynchronous invocations; ours are kept where they enter: "
             "every EventBridge target has its own DLQ and alarm (cdk/events.py), Step Functions invokes the "
             "workflow tasks synchronously and retries/catches them in the ASL, SNS retries the Slack post"),
    Accepted("CKV_AWS_117", _ours,
             "the controller calls only AWS APIs in four regions and Slack; a VPC would need NAT gateways or "
             "interface endpoints in each (a standing cost) and isolates nothing the per-function roles do not"),
    Accepted("CKV_AWS_173", _ours,
             "the environment holds resource names and ARNs only; the one secret (the Slack webhook) lives in "
             "Secrets Manager, and Lambda encrypts the environment at rest with its AWS managed key"),
    Accepted("CKV_AWS_115", _cdk_internal_function, _CDK_HANDLER),
    Accepted("CKV_AWS_116", _cdk_internal_function, _CDK_HANDLER),
    Accepted("CKV_AWS_117", _cdk_internal_function, _CDK_HANDLER),
    Accepted("CKV_AWS_173", _cdk_internal_function, _CDK_HANDLER),
    Accepted("CKV_AWS_119", _type("AWS::DynamoDB::Table"),
             "encrypted at rest with the AWS managed key (SSESpecification.SSEEnabled); the tables hold job and "
             "node metadata, no secrets, and a customer key would add a key policy to keep and a cost per request"),
    Accepted("CKV_AWS_149", _type("AWS::SecretsManager::Secret"),
             "encrypted with the AWS managed key aws/secretsmanager; only slack_notifier's role may read it "
             "(cdk/permissions.py), which a customer key would not narrow further"),
    Accepted("CKV_AWS_158", _type("AWS::Logs::LogGroup"),
             "CloudWatch Logs encrypts every log group at rest; ours hold ids, states and errors, never secrets, "
             "and a customer key per region would need a key policy for the logs service and cost per request"),
    Accepted("CKV_AWS_18", _access_log_bucket,
             "this bucket receives the server access logs of the stack's other buckets; logging it into itself "
             "would loop, and another log bucket would only move the question"),
    Accepted("CKV_AWS_27", _sse_sqs_queue,
             "encrypted at rest with SQS-owned keys (SqsManagedSseEnabled); checkov 3 recognises only "
             "KmsMasterKeyId, and a customer key per training region (1 USD/month each) adds nothing for a "
             "dead-letter queue of forwarded EC2 events"),
)


def skips_for(node: CfnResource) -> list[dict[str, str]]:
    return [{"id": a.rule, "comment": a.reason} for a in ACCEPTED if a.applies(node)]


@jsii.implements(IAspect)
class _WriteSkips:
    def visit(self, node: IConstruct) -> None:
        if isinstance(node, CfnResource):
            skips = skips_for(node)
            if skips:
                node.add_metadata(SKIP_KEY, {"skip": skips})


def add_skips(scope: IConstruct) -> None:
    Aspects.of(scope).add(_WriteSkips())

