"""JobStore on DynamoDB. Every write is conditional on (status, version); a lost race is a
``ConflictError`` and changes nothing.

Items keep their key and index attributes at the top level and the full record as JSON in ``doc``:
floats stay floats (no Decimal round trips) and the schema can grow without migrations.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from botocore.exceptions import ClientError

from spotrelay.adapters.aws import client, error_code
from spotrelay.domain.models import Job, Node
from spotrelay.domain.status import JobStatus
from spotrelay.errors import AlreadyExistsError, ConflictError, NotFoundError
from spotrelay.ports.job_store import read_change_write
from spotrelay.settings import settings

_CONDITION_FAILED = "ConditionalCheckFailedException"


def _job_item(job: Job) -> dict[str, Any]:
    return {
        "job_id": {"S": job.job_id},
        "status": {"S": job.status.value},
        "version": {"N": str(job.version)},
        "updated_at": {"N": repr(float(job.updated_at))},
        "doc": {"S": job.model_dump_json()},
    }


def _node_item(node: Node) -> dict[str, Any]:
    return {
        "job_id": {"S": node.job_id},
        "node_id": {"S": node.node_id},
        "instance_id": {"S": node.instance_id},
        "version": {"N": str(node.version)},
        "doc": {"S": node.model_dump_json()},
    }


def _job(item: dict[str, Any]) -> Job:
    return Job.model_validate(json.loads(item["doc"]["S"]))


def _node(item: dict[str, Any]) -> Node:
    return Node.model_validate(json.loads(item["doc"]["S"]))


class DynamoDBJobStore:
    def __init__(self, jobs_table: str | None = None, nodes_table: str | None = None) -> None:
        self._jobs = jobs_table or settings().jobs_table
        self._nodes = nodes_table or settings().nodes_table

    @property
    def _ddb(self) -> Any:
        return client("dynamodb")

    # --- jobs ----------------------------------------------------------------------------------
    def create_job(self, job: Job) -> None:
        try:
            self._ddb.put_item(
                TableName=self._jobs, Item=_job_item(job), ConditionExpression="attribute_not_exists(job_id)"
            )
        except ClientError as exc:
            if error_code(exc) == _CONDITION_FAILED:
                raise AlreadyExistsError(f"job {job.job_id} already exists") from exc
            raise

    def find_job(self, job_id: str) -> Job | None:
        item = self._ddb.get_item(TableName=self._jobs, Key={"job_id": {"S": job_id}}, ConsistentRead=True)
        return _job(item["Item"]) if "Item" in item else None

    def get_job(self, job_id: str) -> Job:
        job = self.find_job(job_id)
        if job is None:
            raise NotFoundError(f"job {job_id} not found")
        return job

    def save_job(self, job: Job, expected_status: JobStatus, expected_version: int) -> Job:
        new = job.model_copy(update={"version": expected_version + 1})
        try:
            self._ddb.put_item(
                TableName=self._jobs,
                Item=_job_item(new),
                ConditionExpression="#s = :s AND #v = :v",
                ExpressionAttributeNames={"#s": "status", "#v": "version"},
                ExpressionAttributeValues={":s": {"S": expected_status.value}, ":v": {"N": str(expected_version)}},
            )
        except ClientError as exc:
            if error_code(exc) == _CONDITION_FAILED:
                raise ConflictError(
                    f"job {job.job_id} changed since read (expected {expected_status} v{expected_version})"
                ) from exc
            raise
        return new

    def update_job(self, job_id: str, change: Callable[[Job], Job | None], attempts: int = 3) -> Job | None:
        return read_change_write(
            lambda: self.get_job(job_id), change, lambda new, old: self.save_job(new, old.status, old.version),
            attempts,
        )

    def _items(self, operation: str, **kwargs: Any) -> list[dict[str, Any]]:
        """Every item of a query or scan, across pages."""
        pages = self._ddb.get_paginator(operation).paginate(**kwargs)
        return [item for page in pages for item in page.get("Items", [])]

    def jobs_by_status(self, status: JobStatus) -> list[Job]:
        items = self._items(
            "query",
            TableName=self._jobs,
            IndexName="by-status",
            KeyConditionExpression="#s = :s",
            ExpressionAttributeNames={"#s": "status"},
            ExpressionAttributeValues={":s": {"S": status.value}},
        )
        return [_job(i) for i in items]

    def all_jobs(self) -> list[Job]:
        return sorted((_job(i) for i in self._items("scan", TableName=self._jobs)), key=lambda j: j.created_at)

    # --- nodes ---------------------------------------------------------------------------------
    def put_node(self, node: Node, expected_version: int | None = None) -> Node:
        if expected_version is None:
            new = node.model_copy(update={"version": 1})
            condition: dict[str, Any] = {"ConditionExpression": "attribute_not_exists(node_id)"}
        else:
            new = node.model_copy(update={"version": expected_version + 1})
            condition = {
                "ConditionExpression": "#v = :v",
                "ExpressionAttributeNames": {"#v": "version"},
                "ExpressionAttributeValues": {":v": {"N": str(expected_version)}},
            }
        try:
            self._ddb.put_item(TableName=self._nodes, Item=_node_item(new), **condition)
        except ClientError as exc:
            if error_code(exc) == _CONDITION_FAILED:
                if expected_version is None:
                    raise AlreadyExistsError(f"node {node.job_id}/{node.node_id} already exists") from exc
                raise ConflictError(f"node {node.job_id}/{node.node_id} changed since read") from exc
            raise
        return new

    def get_node(self, job_id: str, node_id: str) -> Node:
        item = self._ddb.get_item(
            TableName=self._nodes, Key={"job_id": {"S": job_id}, "node_id": {"S": node_id}}, ConsistentRead=True
        )
        if "Item" not in item:
            raise NotFoundError(f"node {job_id}/{node_id} not found")
        return _node(item["Item"])

    def nodes_of(self, job_id: str) -> list[Node]:
        items = self._items(
            "query",
            TableName=self._nodes,
            KeyConditionExpression="job_id = :j",
            ExpressionAttributeValues={":j": {"S": job_id}},
            ConsistentRead=True,
        )
        return [_node(i) for i in items]

    def delete_node(self, node: Node) -> bool:
        try:
            self._ddb.delete_item(
                TableName=self._nodes, Key={"job_id": {"S": node.job_id}, "node_id": {"S": node.node_id}},
                ConditionExpression="#v = :v", ExpressionAttributeNames={"#v": "version"},
                ExpressionAttributeValues={":v": {"N": str(node.version)}},
            )
        except ClientError as exc:
            if error_code(exc) == _CONDITION_FAILED:
                return False  # changed since read, or deleted already
            raise
        return True

    def node_by_instance(self, instance_id: str) -> Node | None:
        page = self._ddb.query(
            TableName=self._nodes,
            IndexName="by-instance",
            KeyConditionExpression="instance_id = :i",
            ExpressionAttributeValues={":i": {"S": instance_id}},
        )
        items = page.get("Items", [])
        if not items:
            return None
        # the index is eventually consistent: re-read the base item
        node = _node(items[0])
        return self.get_node(node.job_id, node.node_id)

    def update_node(
        self, job_id: str, node_id: str, change: Callable[[Node], Node | None], attempts: int = 3
    ) -> Node | None:
        return read_change_write(
            lambda: self.get_node(job_id, node_id), change,
            lambda new, old: self.put_node(new, expected_version=old.version), attempts,
        )
