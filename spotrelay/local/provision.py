"""Create the controller's resources in moto from the shared description (spotrelay.resources)."""

from __future__ import annotations

from typing import Any

from spotrelay.adapters.aws import client
from spotrelay.resources import RESOURCES, Table
from spotrelay.settings import settings


def table_name(table: Table) -> str:
    s = settings()
    return {
        "Jobs": s.jobs_table, "Nodes": s.nodes_table, "PoolStats": s.pools_table,
        "Idempotency": s.idempotency_table,
    }[table.logical]


def create_table(table: Table) -> None:
    ddb = client("dynamodb")
    attrs = {table.partition_key: "S"}
    keys: list[dict[str, Any]] = [{"AttributeName": table.partition_key, "KeyType": "HASH"}]
    if table.sort_key:
        attrs[table.sort_key] = "S"
        keys.append({"AttributeName": table.sort_key, "KeyType": "RANGE"})
    gsis = []
    for index in table.indexes:
        attrs[index.partition_key] = "S"
        schema: list[dict[str, Any]] = [{"AttributeName": index.partition_key, "KeyType": "HASH"}]
        if index.sort_key:
            # sort keys of our indexes are timestamps
            attrs[index.sort_key] = "N" if index.sort_key.endswith("_at") else "S"
            schema.append({"AttributeName": index.sort_key, "KeyType": "RANGE"})
        gsis.append({"IndexName": index.name, "KeySchema": schema, "Projection": {"ProjectionType": "ALL"}})
    kwargs: dict[str, Any] = {
        "TableName": table_name(table),
        "KeySchema": keys,
        "AttributeDefinitions": [{"AttributeName": k, "AttributeType": t} for k, t in attrs.items()],
        "BillingMode": "PAY_PER_REQUEST",
    }
    if gsis:
        kwargs["GlobalSecondaryIndexes"] = gsis
    ddb.create_table(**kwargs)
    if table.ttl_attribute:
        ddb.update_time_to_live(
            TableName=table_name(table),
            TimeToLiveSpecification={"Enabled": True, "AttributeName": table.ttl_attribute},
        )


def create_bucket() -> None:
    s3 = client("s3")
    s3.create_bucket(Bucket=settings().bucket)
    s3.put_bucket_versioning(Bucket=settings().bucket, VersioningConfiguration={"Status": "Enabled"})
    s3.put_bucket_notification_configuration(
        Bucket=settings().bucket, NotificationConfiguration={"EventBridgeConfiguration": {}}
    )


def create_topic() -> str:
    arn: str = client("sns").create_topic(Name=RESOURCES.topic_default)["TopicArn"]
    return arn


def create_storage() -> dict[str, str]:
    """Tables, bucket and topic: what the job store, submissions and notifications need."""
    for table in RESOURCES.tables:
        create_table(table)
    create_bucket()
    return {"topic_arn": create_topic()}
