"""One Lambda per ``functions/<module>.py`` handler, each with its own role, log group and grants."""

from __future__ import annotations

import json
import platform
from dataclasses import dataclass

from aws_cdk import Acknowledgment, Aws, Duration, RemovalPolicy, Validations
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from cdk import staging
from cdk.agent_boundary import checkpoint_buckets, dataset_roots, job_profiles_config
from cdk.config import AppConfig
from cdk.permissions import Grants, grant
from spotrelay.resources import RESOURCES, function_name_for

# Per-handler timeouts: sfn tasks call EC2 (CreateFleet can take a while); the rest are quick.
TIMEOUTS = {"sfn_": 120, "reconcile": 120}
# Reserved concurrency: a flood of EC2 events cannot starve the workflow's tasks (each kind has its own
# share; throttled event invocations wait in Lambda's async queue, throttled tasks are retried by the ASL),
# and one reconcile sweep runs at a time. 112 in all (docs/security.md): the rest stays unreserved.
RESERVED = {"on_": 10, "sfn_": 10, "reconcile": 1, "slack_notifier": 1}


@dataclass(frozen=True)
class HandlerEnv:
    """Names and ARNs handlers read through spotrelay.settings (env var -> value)."""

    values: dict[str, str]


def runtime() -> lambda_.Runtime:
    version = staging.lambda_python_version()
    return {"3.11": lambda_.Runtime.PYTHON_3_11, "3.12": lambda_.Runtime.PYTHON_3_12}[version]


def architecture() -> lambda_.Architecture:
    # the layer holds this machine's compiled wheels
    return lambda_.Architecture.ARM_64 if platform.machine() in ("arm64", "aarch64") else lambda_.Architecture.X86_64


class Functions(Construct):
    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        config: AppConfig,
        env: HandlerEnv,
        grants: Grants,
        handlers: list[str] | None = None,
    ) -> None:
        super().__init__(scope, id)
        self.handlers = handlers if handlers is not None else staging.discover_handlers()
        self.layer = lambda_.LayerVersion(
            self,
            "Layer",
            code=lambda_.Code.from_asset(str(staging.stage_layer())),
            compatible_runtimes=[runtime()],
            compatible_architectures=[architecture()],
            description="spotrelay dependencies: powertools, pydantic, pyyaml, requests (no torch)",
        )
        code = lambda_.Code.from_asset(str(staging.stage_handlers()))
        self.functions: dict[str, lambda_.Function] = {}
        self.names: dict[str, str] = {}  # module -> function name (resources.function_name_for)
        for module in self.handlers:
            name = function_name_for(module, prefix=f"{config.prefix}-")
            construct_id = "".join(part.title() for part in module.split("_"))
            role = iam.Role(
                self,
                f"{construct_id}Role",
                assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
                description=f"{name}: only what {module} needs",
            )
            log_group = logs.LogGroup(
                self,
                f"{construct_id}Logs",
                log_group_name=f"/aws/lambda/{name}",
                removal_policy=RemovalPolicy.DESTROY,
            )
            # RetentionDays is a name enum in Python; the days from config go in directly
            log_group.node.default_child.retention_in_days = config.log_retention_days  # type: ignore[union-attr]
            timeout = next((t for key, t in TIMEOUTS.items() if module.startswith(key)), 60)
            reserved = next((n for key, n in RESERVED.items() if module.startswith(key)), 1)
            fn = lambda_.Function(
                self,
                construct_id,
                function_name=name,
                runtime=runtime(),
                architecture=architecture(),
                handler=f"functions.{module}.handler",
                code=code,
                layers=[self.layer],
                role=role,
                log_group=log_group,
                memory_size=512,
                timeout=Duration.seconds(timeout),
                reserved_concurrent_executions=reserved,
                tracing=lambda_.Tracing.ACTIVE,
                environment={
                    **env.values,
                    "POWERTOOLS_SERVICE_NAME": "spotrelay",
                    "POWERTOOLS_METRICS_NAMESPACE": "spotrelay",
                    "SPOTRELAY_FUNCTION": module,
                },
                description=f"spotrelay {module}",
            )
            grant(role, module, grants)
            log_group.grant_write(role)  # the Lambda service writes the function's logs with this role
            Validations.of(fn).acknowledge(
                Acknowledgment(
                    id="AwsSolutions-L1",
                    reason="runtime pinned to the Python minor version the layer's compiled wheels "
                    "(pydantic-core, PyYAML) were built for; see cdk/staging.py",
                )
            )
            self.functions[module] = fn
            self.names[module] = name

    def function(self, module: str) -> lambda_.Function | None:
        return self.functions.get(module)


def handler_env(
    config: AppConfig,
    *,
    tables: dict[str, str],
    bucket: str,
    topic_arn: str,
    state_machine_arn: str,
    slack_secret_arn: str,
) -> HandlerEnv:
    """The variables spotrelay.settings reads, plus what provisioning needs to reach the regions."""
    r = RESOURCES
    values = {table.env: tables[table.logical] for table in r.tables}
    values.update(
        {
            r.bucket_env: bucket,
            r.topic_env: topic_arn,
            r.state_machine_env: state_machine_arn,
            r.event_bus_env: "default",
            r.slack_secret_env: slack_secret_arn,
            "SPOTRELAY_PREFIX": config.prefix,
            "SPOTRELAY_HOME_REGION": config.home_region,
            "SPOTRELAY_TRAINING_REGIONS": ",".join(config.training_regions),
            "SPOTRELAY_INSTANCE_TYPES": ",".join(config.instance_types),
            "SPOTRELAY_REGIONS": ",".join(config.training_regions),  # reconcile sweeps these
            "SPOTRELAY_RECONCILE_S": str(config.reconcile_minutes * 60),  # the budget stops a sweep ahead
            # the compute adapter reads subnets, security group and launch template from the training
            # stacks' SSM parameters (spotrelay/adapters/ec2_discovery.py), and gives each job its own
            # instance profile (spotrelay/adapters/iam_job_profile.py, cdk/agent_boundary.py)
            "SPOTRELAY_EC2_CONFIG": json.dumps(
                {"ssm_prefix": f"/{config.prefix}/training", "job_profiles": job_profiles_config(config)}
            ),
            "SPOTRELAY_ACCOUNT": Aws.ACCOUNT_ID,
            r.checkpoint_roots_env: ",".join(f"s3://{b}/{r.checkpoints_prefix}" for b in checkpoint_buckets(config)),
            r.dataset_roots_env: ",".join(dataset_roots(config)),
            r.fsx_env: "true" if config.fsx_enabled else "false",
        }
    )
    return HandlerEnv(values)
