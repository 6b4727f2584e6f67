"""One training region: EC2 events forwarded home, a data/checkpoint bucket replicated home, the VPC,
the agent's launch template, optional FSx for Lustre, and SSM parameters the controller reads."""

from __future__ import annotations

from typing import Any

from aws_cdk import Aws, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_fsx as fsx
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_ssm as ssm
from constructs import Construct

from cdk import nag
from cdk.agent_fleet import AgentFleet
from cdk.config import AppConfig
from cdk.events import MAX_EVENT_AGE, RETRY_ATTEMPTS, dead_letter_queue, event_pattern
from cdk.storage import access_log_bucket, checkpoint_lifecycle, jobs_bucket_name, secure_bucket
from spotrelay.resources import FORWARDED_EC2_PATTERNS, RESOURCES

FORWARD_IDS = ("SpotInterruption", "Rebalance", "InstanceState")  # same order as FORWARDED_EC2_PATTERNS


def _zones(config: AppConfig, region: str) -> dict[str, Any]:
    zones = config.availability_zones.get(region)
    return {"availability_zones": list(zones)} if zones else {"max_azs": 2}


def data_bucket_name(config: AppConfig, region: str) -> str:
    return f"{config.prefix}-data-{Aws.ACCOUNT_ID}-{region}"


class RegionalStack(Stack):
    def __init__(self, scope: Construct, id: str, *, config: AppConfig, region: str, **kwargs: Any) -> None:
        super().__init__(scope, id, **kwargs)
        self.forward_rules: list[events.Rule] = []
        if region != config.home_region:  # in the home region the home rules already see these events
            home_bus = events.EventBus.from_event_bus_arn(
                self, "HomeBus", f"arn:{Aws.PARTITION}:events:{config.home_region}:{Aws.ACCOUNT_ID}:event-bus/default"
            )
            for rule_id, pattern in zip(FORWARD_IDS, FORWARDED_EC2_PATTERNS, strict=True):
                dlq = dead_letter_queue(self, f"{rule_id}Dlq")
                rule = events.Rule(
                    self,
                    f"Forward{rule_id}",
                    description=f"forward {pattern['detail-type'][0]} to the home bus ({config.home_region})",  # type: ignore[index]
                    event_pattern=event_pattern(pattern),
                    targets=[targets.EventBus(home_bus, dead_letter_queue=dlq)],
                )
                # EventBus targets take no retry policy in the L2; set the same one as the home rules
                rule.node.default_child.add_property_override(  # type: ignore[union-attr]
                    "Targets.0.RetryPolicy",
                    {"MaximumEventAgeInSeconds": MAX_EVENT_AGE.to_seconds(), "MaximumRetryAttempts": RETRY_ATTEMPTS},
                )
                self.forward_rules.append(rule)

        self.vpc = ec2.Vpc(
            self,
            "Vpc",
            ip_addresses=ec2.IpAddresses.cidr(config.vpc_cidr(region)),
            **_zones(config, region),
            nat_gateways=1,
            subnet_configuration=[
                ec2.SubnetConfiguration(name="public", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=24),
                # /19: room for six AZs in a /16, 8k addresses each
                ec2.SubnetConfiguration(name="nodes", subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS, cidr_mask=19),
            ],
            gateway_endpoints={
                "S3": ec2.GatewayVpcEndpointOptions(service=ec2.GatewayVpcEndpointAwsService.S3),
                "DynamoDB": ec2.GatewayVpcEndpointOptions(service=ec2.GatewayVpcEndpointAwsService.DYNAMODB),
            },
        )
        if config.availability_zones.get(region):
            # Named AZs are the point of the setting (Spot capacity is per AZ): tell cfn-lint (W3010).
            for subnet in self.vpc.public_subnets + self.vpc.private_subnets:
                subnet.node.default_child.add_metadata(  # type: ignore[union-attr]
                    "cfn-lint", {"config": {"ignore_checks": ["W3010"]}}
                )
        flow_logs = logs.LogGroup(self, "FlowLogs")
        flow_logs.node.default_child.retention_in_days = config.log_retention_days  # type: ignore[union-attr]
        self.vpc.add_flow_log(
            "FlowLog",
            destination=ec2.FlowLogDestination.to_cloud_watch_logs(flow_logs),
            traffic_type=ec2.FlowLogTrafficType.REJECT,
        )

        access_logs = access_log_bucket(self, "AccessLogs", config.log_retention_days)
        home_bucket = s3.Bucket.from_bucket_attributes(
            self,
            "HomeBucket",
            bucket_name=jobs_bucket_name(config, config.home_region),
            region=config.home_region,
            account=Aws.ACCOUNT_ID,
        )
        ckpt = RESOURCES.checkpoints_prefix
        self.data_bucket = secure_bucket(
            self,
            "DataBucket",
            name=data_bucket_name(config, region),
            logs=access_logs,
            logs_prefix="data/",
            lifecycle_rules=checkpoint_lifecycle(ckpt, config.checkpoint_glacier_days),
            # committed checkpoints go home, so a job can resume in any region
            replication_rules=[
                s3.ReplicationRule(
                    destination=home_bucket,
                    priority=1,
                    id="checkpoints-to-home",
                    filter=s3.Filter(prefix=ckpt),
                    delete_marker_replication=False,
                )
            ],
        )

        self.fleet = AgentFleet(self, "Agent", config=config, region=region, vpc=self.vpc, data_bucket=self.data_bucket)
        private = self.vpc.select_subnets(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS)
        self.file_system: fsx.CfnFileSystem | None = None
        if config.fsx_enabled:
            self.file_system = fsx.CfnFileSystem(
                self,
                "Lustre",
                file_system_type="LUSTRE",
                storage_capacity=config.fsx_storage_gib,
                subnet_ids=[private.subnet_ids[0]],
                security_group_ids=[self.fleet.security_group.security_group_id],
                lustre_configuration=fsx.CfnFileSystem.LustreConfigurationProperty(
                    deployment_type="SCRATCH_2",
                    import_path=f"s3://{self.data_bucket.bucket_name}/data",
                    export_path=f"s3://{self.data_bucket.bucket_name}/data",
                    auto_import_policy="NEW_CHANGED_DELETED",
                ),
            )

        prefix = f"/{config.prefix}/training"
        parameters = {
            "subnets": ",".join(private.subnet_ids),
            "security-group": self.fleet.security_group.security_group_id,
            "launch-template": self.fleet.launch_template.ref,
            "instance-profile": self.fleet.instance_profile.instance_profile_arn,
            "data-bucket": self.data_bucket.bucket_name,
        }
        if self.file_system is not None:
            parameters["fsx-dns"] = self.file_system.attr_dns_name
            parameters["fsx-mount-name"] = self.file_system.attr_lustre_mount_name
        for key, value in parameters.items():
            ssm.StringParameter(
                self,
                f"Param-{key}",
                parameter_name=f"{prefix}/{key}",
                string_value=value,
                description=f"spotrelay {region}: {key} (read by the controller)",
            )
        self.parameters = parameters
        self.unexplained_wildcards = nag.acknowledge_wildcards(self)
