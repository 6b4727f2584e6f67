"""Tables (from spotrelay.resources) and the jobs bucket of the home region."""

from __future__ import annotations

from aws_cdk import Aws, Duration, RemovalPolicy
from aws_cdk import aws_dynamodb as ddb
from aws_cdk import aws_s3 as s3
from constructs import Construct

from cdk.config import AppConfig
from spotrelay.resources import RESOURCES, Table


def table_name(config: AppConfig, table: Table) -> str:
    """``spotrelay-jobs`` with the default prefix, so the twin's names and AWS's agree."""
    return config.prefix + table.default_name.removeprefix("spotrelay")


def jobs_bucket_name(config: AppConfig, region: str) -> str:
    # Account and region make the global name unique; regional stacks rebuild it to replicate here.
    return f"{config.prefix}-jobs-{Aws.ACCOUNT_ID}-{region}"


def _key_type(attribute: str) -> ddb.AttributeType:
    # provision.create_table's rule: index sort keys named *_at are epoch numbers
    return ddb.AttributeType.NUMBER if attribute.endswith("_at") else ddb.AttributeType.STRING


def secure_bucket(
    scope: Construct, id: str, *, name: str | None, logs: s3.IBucket | None, logs_prefix: str = "", **kwargs: object
) -> s3.Bucket:
    """Encrypted, private, TLS-only, versioned; access logs to ``logs`` (None: this is the log bucket)."""
    return s3.Bucket(
        scope,
        id,
        bucket_name=name,
        encryption=s3.BucketEncryption.S3_MANAGED,
        block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
        enforce_ssl=True,
        versioned=True,
        object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
        server_access_logs_bucket=logs,
        server_access_logs_prefix=logs_prefix or None,
        removal_policy=RemovalPolicy.RETAIN,
        **kwargs,  # type: ignore[arg-type]
    )


def checkpoint_lifecycle(prefix: str, glacier_days: int) -> list[s3.LifecycleRule]:
    """Old checkpoints go to Glacier; replaced versions and abandoned multipart uploads expire."""
    return [
        s3.LifecycleRule(
            id="checkpoints-to-glacier",
            prefix=prefix,
            transitions=[
                s3.Transition(storage_class=s3.StorageClass.GLACIER, transition_after=Duration.days(glacier_days))
            ],
            noncurrent_version_expiration=Duration.days(7),
        ),
        s3.LifecycleRule(id="abort-incomplete-uploads", abort_incomplete_multipart_upload_after=Duration.days(2)),
    ]


def access_log_bucket(scope: Construct, id: str, retention_days: int) -> s3.Bucket:
    return secure_bucket(
        scope,
        id,
        name=None,
        logs=None,
        lifecycle_rules=[
            s3.LifecycleRule(
                id="expire-access-logs",
                expiration=Duration.days(retention_days),
                noncurrent_version_expiration=Duration.days(1),
            )
        ],
    )


class Storage(Construct):
    """DynamoDB tables with PITR and the jobs bucket (submissions, checkpoints, artifacts)."""

    def __init__(self, scope: Construct, id: str, *, config: AppConfig) -> None:
        super().__init__(scope, id)
        self.tables: dict[str, ddb.Table] = {}
        for spec in RESOURCES.tables:
            table = ddb.Table(
                self,
                spec.logical,
                table_name=table_name(config, spec),
                partition_key=ddb.Attribute(name=spec.partition_key, type=ddb.AttributeType.STRING),
                sort_key=ddb.Attribute(name=spec.sort_key, type=ddb.AttributeType.STRING) if spec.sort_key else None,
                billing_mode=ddb.BillingMode.PAY_PER_REQUEST,
                point_in_time_recovery_specification=ddb.PointInTimeRecoverySpecification(
                    point_in_time_recovery_enabled=True
                ),
                encryption=ddb.TableEncryption.AWS_MANAGED,
                time_to_live_attribute=spec.ttl_attribute,
                deletion_protection=True,
                removal_policy=RemovalPolicy.RETAIN,
            )
            for index in spec.indexes:
                table.add_global_secondary_index(
                    index_name=index.name,
                    partition_key=ddb.Attribute(name=index.partition_key, type=ddb.AttributeType.STRING),
                    sort_key=ddb.Attribute(name=index.sort_key, type=_key_type(index.sort_key))
                    if index.sort_key
                    else None,
                    projection_type=ddb.ProjectionType.ALL,
                )
            self.tables[spec.logical] = table

        self.access_logs = access_log_bucket(self, "AccessLogs", config.log_retention_days)
        checkpoints = RESOURCES.checkpoints_prefix
        self.bucket = secure_bucket(
            self,
            "JobsBucket",
            name=jobs_bucket_name(config, config.home_region),
            logs=self.access_logs,
            logs_prefix="jobs/",
            event_bridge_enabled=True,  # submissions/ reach on_submission through EventBridge
            lifecycle_rules=checkpoint_lifecycle(checkpoints, config.checkpoint_glacier_days),
        )
