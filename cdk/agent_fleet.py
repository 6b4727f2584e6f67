"""What a training node runs with in one region: its security group and launch template, and the
regional fallback role.

Per job: the controller launches every node with its job's own instance profile, created at launch
(``spotrelay/adapters/iam_job_profile.py``; path ``/spotrelay/``, bounded by ``cdk/agent_boundary.py``):
only ``checkpoints/<job>/`` of the jobs and data buckets, that job's spec object, reads of the DynamoDB
items whose partition key is the job id, and PutEvents with source ``spotrelay.agent``. Teardown deletes it.

The regional role below is only the fallback for nodes started by hand from this launch template
(the controller cannot pass it: its PassRole covers only ``/spotrelay/<prefix>-agent-job-*``).
It reaches only the agent's own calls: ``checkpoints/`` of the home jobs bucket (the default
durable tier, so a job resumes in any region) and of this region's data bucket (replicated home),
``code/`` of the home jobs bucket read-only (entrypoint.code archives, as the per-job profiles),
``data/`` and ``artifacts/agent/`` of the data bucket read-only, reads of job and node items in the
home tables (the agent writes none), and PutEvents with source ``spotrelay.agent`` on the home bus.
Job and rank come from instance tags read through IMDS (InstanceMetadataTags), so the role needs no
ec2:Describe*.

Not per job: it serves every manually launched node in the region (an instance profile cannot see the
instance's tags), so such a node could read another job's checkpoints. See docs/deploy.md, "Security notes".
"""

from __future__ import annotations

from aws_cdk import Aws, CfnParameter, CfnTag, Fn
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from constructs import Construct

from agent.userdata import UserDataParams, render_user_data
from cdk.agent_boundary import dataset_statements
from cdk.config import AppConfig
from cdk.storage import jobs_bucket_name, table_name
from spotrelay.contracts.agent import AGENT_TABLE_ACTIONS
from spotrelay.contracts.events import AGENT_SOURCE
from spotrelay.ports.logs import LOG_GROUP_DEFAULT, LOG_GROUP_ENV
from spotrelay.resources import JOBS, NODES, RESOURCES

ROOT_VOLUME_GIB = 500
# Where the release process puts the agent wheel (docs/deploy.md); the name follows the version.
AGENT_WHEEL_KEY = "artifacts/agent/spotrelay-0.1.0-py3-none-any.whl"


def agent_role_name(config: AppConfig, region: str) -> str:
    # the manual-launch fallback; the controller launches with per-job profiles (iam_job_profile)
    return f"{config.prefix}-agent-{region}"


class AgentFleet(Construct):
    def __init__(
        self, scope: Construct, id: str, *, config: AppConfig, region: str, vpc: ec2.IVpc, data_bucket: s3.IBucket
    ) -> None:
        super().__init__(scope, id)
        part, acct, home = Aws.PARTITION, Aws.ACCOUNT_ID, config.home_region
        ckpt = f"{RESOURCES.checkpoints_prefix}*"

        self.security_group = ec2.SecurityGroup(
            self,
            "Members",
            vpc=vpc,
            allow_all_outbound=True,
            description="spotrelay cluster members: all traffic among members (NCCL, EFA), nothing else in",
        )
        # EFA needs all traffic to and from the same group, in both directions.
        self.security_group.add_ingress_rule(self.security_group, ec2.Port.all_traffic(), "members (NCCL/EFA)")
        self.security_group.add_egress_rule(self.security_group, ec2.Port.all_traffic(), "members (EFA)")

        self.role = iam.Role(
            self,
            "Role",
            role_name=agent_role_name(config, region),
            assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
            description="spotrelay agent: its checkpoints/data paths and its own agent calls only",
        )
        data_bucket.grant_read(self.role, "data/*")
        for statement in dataset_statements(config):  # the team's own datasets (deploy.md: dataset_buckets)
            self.role.add_to_policy(statement)
        data_bucket.grant_read(self.role, "artifacts/agent/*")
        data_bucket.grant_read_write(self.role, ckpt)
        data_bucket.grant_delete(self.role, ckpt)  # keep-newest-K pruning of the durable tier
        home_bucket = f"arn:{part}:s3:::{jobs_bucket_name(config, home)}"
        self.role.add_to_policy(
            iam.PolicyStatement(
                actions=["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"],
                resources=[f"{home_bucket}/{ckpt}"],
            )
        )
        self.role.add_to_policy(
            iam.PolicyStatement(
                actions=["s3:ListBucket"], resources=[home_bucket], conditions={"StringLike": {"s3:prefix": [ckpt]}}
            )
        )
        # entrypoint.code archives (content-addressed, read-only), as the per-job profiles allow
        self.role.add_to_policy(
            iam.PolicyStatement(actions=["s3:GetObject"], resources=[f"{home_bucket}/{RESOURCES.code_prefix}*"])
        )
        table_arn = f"arn:{part}:dynamodb:{home}:{acct}:table/"
        # the agent's port reads its job's records; it writes none (it reports events instead)
        self.role.add_to_policy(
            iam.PolicyStatement(
                actions=list(AGENT_TABLE_ACTIONS),
                resources=[table_arn + table_name(config, NODES), table_arn + table_name(config, JOBS)],
            )
        )
        self.role.add_to_policy(
            iam.PolicyStatement(
                actions=["events:PutEvents"],
                resources=[f"arn:{part}:events:{home}:{acct}:event-bus/default"],
                conditions={"StringEquals": {"events:source": [AGENT_SOURCE]}},
            )
        )
        self.role.add_to_policy(
            iam.PolicyStatement(
                actions=["logs:CreateLogStream", "logs:PutLogEvents"],
                resources=[f"arn:{part}:logs:{home}:{acct}:log-group:{LOG_GROUP_DEFAULT}:log-stream:*"],
            )
        )
        self.instance_profile = iam.InstanceProfile(self, "Profile", role=self.role)

        ami = CfnParameter(
            self,
            "DeepLearningAmi",
            type="AWS::SSM::Parameter::Value<AWS::EC2::Image::Id>",
            default=config.dlami_ssm_parameter,
            description="SSM parameter holding the Deep Learning AMI id (resolved at deploy time)",
        )
        # The same systemd bootstrap the agent ships (agent/userdata.py); job, attempt and rank
        # come from the instance tags, so one template serves every node of every job.
        user_data = render_user_data(UserDataParams(
            home_region=home,
            wheel_uri=f"s3://{data_bucket.bucket_name}/{AGENT_WHEEL_KEY}",
            env={
                "SPOTRELAY_HOME_REGION": home,
                "SPOTRELAY_BUCKET": jobs_bucket_name(config, home),
                "SPOTRELAY_DATA_BUCKET": data_bucket.bucket_name,
                "SPOTRELAY_PREFIX": config.prefix,
                "SPOTRELAY_JOBS_TABLE": table_name(config, JOBS),
                "SPOTRELAY_NODES_TABLE": table_name(config, NODES),
                "SPOTRELAY_EVENT_BUS": f"arn:{part}:events:{home}:{acct}:event-bus/default",
                LOG_GROUP_ENV: LOG_GROUP_DEFAULT,  # the home stack's group; the agent ships train-a<N>.log
            },
        ))
        self.launch_template = ec2.CfnLaunchTemplate(
            self,
            "LaunchTemplate",
            launch_template_name=f"{config.prefix}-agent",
            launch_template_data=ec2.CfnLaunchTemplate.LaunchTemplateDataProperty(
                image_id=ami.value_as_string,
                # no instance type: the fleet request picks one per pool (not every type exists everywhere)
                iam_instance_profile=ec2.CfnLaunchTemplate.IamInstanceProfileProperty(
                    arn=self.instance_profile.instance_profile_arn
                ),
                metadata_options=ec2.CfnLaunchTemplate.MetadataOptionsProperty(
                    http_tokens="required",
                    http_endpoint="enabled",
                    http_put_response_hop_limit=2,
                    instance_metadata_tags="enabled",
                ),
                # EFA on network card 0; the controller writes a per-launch template with one EFA per card
                network_interfaces=[
                    ec2.CfnLaunchTemplate.NetworkInterfaceProperty(
                        device_index=0,
                        network_card_index=0,
                        interface_type="efa",
                        groups=[self.security_group.security_group_id],
                        delete_on_termination=True,
                    )
                ],
                block_device_mappings=[
                    ec2.CfnLaunchTemplate.BlockDeviceMappingProperty(
                        device_name="/dev/sda1",
                        ebs=ec2.CfnLaunchTemplate.EbsProperty(
                            volume_size=ROOT_VOLUME_GIB, volume_type="gp3", encrypted=True, delete_on_termination=True
                        ),
                    )
                ],
                monitoring=ec2.CfnLaunchTemplate.MonitoringProperty(enabled=True),
                user_data=Fn.base64(user_data),
                tag_specifications=[
                    ec2.CfnLaunchTemplate.TagSpecificationProperty(
                        resource_type="volume", tags=[CfnTag(key="spotrelay:deployment", value=config.prefix)]
                    )
                ],
            ),
        )
