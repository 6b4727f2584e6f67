"""The home region: storage, handlers, the job-run workflow, rules, notifications and monitoring."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aws_cdk import CfnOutput, Stack
from aws_cdk import aws_logs as logs
from constructs import Construct

from cdk import nag
from cdk.agent_boundary import AgentBoundary, boundary_arn
from cdk.cli_access import CliPolicies, logical_id
from cdk.config import AppConfig
from cdk.events import Events
from cdk.functions import Functions, handler_env
from cdk.monitoring import Monitoring
from cdk.notifications import Notifications
from cdk.permissions import Grants, state_machine_arn
from cdk.storage import Storage
from cdk.workflow import ASL_PATH, Workflow
from spotrelay.ports.logs import LOG_GROUP_DEFAULT
from spotrelay.resources import RESOURCES

SLACK_NOTIFIER = "slack_notifier"


class HomeStack(Stack):
    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        config: AppConfig,
        handlers: list[str] | None = None,
        asl_path: Path = ASL_PATH,
        **kwargs: Any,
    ) -> None:
        super().__init__(scope, id, **kwargs)
        self.config = config
        storage = Storage(self, "Storage", config=config)
        notifications = Notifications(self, "Notifications", config=config)
        self.agent_boundary = AgentBoundary(self, "AgentBoundary", config=config)
        # the nodes' training output (agent/log_shipper.py; `spotrelay logs` reads it)
        training_logs = logs.LogGroup(self, "TrainingLogs", log_group_name=LOG_GROUP_DEFAULT)
        training_logs.node.default_child.retention_in_days = config.log_retention_days  # type: ignore[union-attr]
        sm_name = config.resource_name("job-run")
        table_names = {logical: table.table_name for logical, table in storage.tables.items()}
        env = handler_env(
            config,
            tables=table_names,
            bucket=storage.bucket.bucket_name,
            topic_arn=notifications.topic.topic_arn,
            state_machine_arn=state_machine_arn(sm_name),
            slack_secret_arn=notifications.slack_secret.secret_arn,
        )
        grants = Grants(
            tables=dict(storage.tables),
            bucket=storage.bucket,
            topic=notifications.topic,
            state_machine_name=sm_name,
            slack_secret=notifications.slack_secret,
            prefix=config.prefix,
            training_regions=config.training_regions,
            agent_boundary_arn=boundary_arn(config),
            topic_key=notifications.key,
        )
        functions = Functions(self, "Functions", config=config, env=env, grants=grants, handlers=handlers)
        workflow = Workflow(
            self,
            "Workflow",
            config=config,
            name=sm_name,
            functions=dict(functions.functions),
            asl_path=asl_path,
            extra={
                "TopicArn": notifications.topic.topic_arn,
                "JobsTable": table_names["Jobs"],
                "NodesTable": table_names["Nodes"],
                "Bucket": storage.bucket.bucket_name,
            },
        )
        rules = Events(
            self, "Events", config=config, functions=dict(functions.functions), state_machine=workflow.state_machine,
            key=notifications.key,
        )
        notifier = functions.function(SLACK_NOTIFIER)
        if notifier is not None:
            notifications.subscribe_slack(notifier)
        monitoring = Monitoring(
            self,
            "Monitoring",
            config=config,
            topic=notifications.topic,
            state_machine=workflow.state_machine,
            functions=functions.functions,
            dlqs=rules.dlqs,
        )
        self.cli_policies = CliPolicies(self, "CliPolicies", config=config, state_machine=sm_name)
        self.storage, self.notifications, self.functions = storage, notifications, functions
        self.workflow, self.events, self.monitoring = workflow, rules, monitoring

        CfnOutput(self, "JobsBucketName", value=storage.bucket.bucket_name)
        CfnOutput(self, "StateMachineArn", value=workflow.state_machine.state_machine_arn)
        CfnOutput(self, "TopicArn", value=notifications.topic.topic_arn)
        CfnOutput(self, "SlackSecretArn", value=notifications.slack_secret.secret_arn)
        for name, policy in self.cli_policies.policies.items():  # attach one to each person's role
            CfnOutput(self, f"{logical_id(name)}PolicyArn", value=policy.managed_policy_arn)
        for table in RESOURCES.tables:
            CfnOutput(self, f"{table.logical}TableName", value=table_names[table.logical])
        nag.acknowledge_cdk_internals(self)
        self.unexplained_wildcards = nag.acknowledge_wildcards(self)
