"""The notifications topic (encrypted, TLS-only), the Slack webhook secret, and e-mail for alarms."""

from __future__ import annotations

from aws_cdk import RemovalPolicy
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_secretsmanager as sm
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subs
from constructs import Construct

from cdk import nag
from cdk.config import AppConfig


class Notifications(Construct):
    def __init__(self, scope: Construct, id: str, *, config: AppConfig) -> None:
        super().__init__(scope, id)
        # A customer-managed key: CloudWatch alarms cannot publish to a topic under the AWS-managed key.
        self.key = kms.Key(
            self,
            "TopicKey",
            enable_key_rotation=True,
            removal_policy=RemovalPolicy.RETAIN,
            description="spotrelay notifications topic",
        )
        self.key.add_to_resource_policy(
            iam.PolicyStatement(
                actions=["kms:Decrypt", "kms:GenerateDataKey*"],
                principals=[
                    iam.ServicePrincipal("cloudwatch.amazonaws.com"),
                    iam.ServicePrincipal("events.amazonaws.com"),
                ],
                resources=["*"],  # "*" in a key policy means this key
            )
        )
        self.topic = sns.Topic(
            self,
            "Topic",
            topic_name=config.resource_name("notifications"),
            master_key=self.key,
            enforce_ssl=True,
            display_name="spotrelay",
        )
        # The webhook URL is put in after deploy (docs/deploy.md); CloudFormation only creates the slot.
        self.slack_secret = sm.Secret(
            self,
            "SlackWebhook",
            secret_name=config.slack_secret_name,
            description='Slack incoming-webhook URL for spotrelay notifications (JSON: {"webhook_url": ...})',
            removal_policy=RemovalPolicy.RETAIN,
        )
        nag.acknowledge(
            self.slack_secret,
            "AwsSolutions-SMG4",
            "a Slack incoming-webhook URL is issued by Slack; no rotation Lambda can mint a new one",
        )
        if config.alarm_email:
            self.topic.add_subscription(subs.EmailSubscription(config.alarm_email))

    def subscribe_slack(self, notifier: lambda_.IFunction) -> None:
        self.topic.add_subscription(subs.LambdaSubscription(notifier))
