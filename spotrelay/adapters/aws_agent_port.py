"""The agent's port on AWS: events on the home EventBridge bus, reads of its job's DynamoDB items.

Writes go only through ``PutEvents`` (source ``spotrelay.agent``); the controller's handlers apply
them. Reads are consistent ``GetItem`` / ``Query`` calls keyed by the job id (the per-job IAM policy
allows nothing else on the tables) that project the stored record (the ``doc`` attribute) onto the
agent's views. The directive read is one GetItem of the node's own item, as before the port: the
notice path (the agent sees a directive, then saves) does not wait on anything new.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import BaseModel

from spotrelay.adapters.aws import client
from spotrelay.adapters.eventbridge_publisher import EventBridgePublisher
from spotrelay.contracts.agent import JobView, NodeView
from spotrelay.contracts.events import AGENT_SOURCE, AgentEventModel
from spotrelay.ports.events import EventPublisher
from spotrelay.resources import RESOURCES
from spotrelay.settings import settings

V = TypeVar("V", bound=BaseModel)
# consistent (a directive is seen on the next poll), only the record (not the key and index attributes)
_READ: dict[str, Any] = {"ConsistentRead": True, "ProjectionExpression": "#d",
                         "ExpressionAttributeNames": {"#d": "doc"}}


def _view(item: dict[str, Any] | None, model: type[V]) -> V | None:
    if not item or "doc" not in item:
        return None
    return model.model_validate(json.loads(item["doc"]["S"]))


class AwsAgentPort:
    def __init__(self, job_id: str, jobs_table: str | None = None, nodes_table: str | None = None,
                 event_bus: str | None = None, publisher: EventPublisher | None = None) -> None:
        self.job_id = job_id
        self._jobs = jobs_table or settings().jobs_table
        self._nodes = nodes_table or settings().nodes_table
        self._publisher = publisher or EventBridgePublisher(event_bus)  # the home bus, in AWS_REGION

    @property
    def _ddb(self) -> Any:
        return client("dynamodb")

    def report(self, event: AgentEventModel) -> None:
        if event.job_id != self.job_id:
            raise ValueError(f"event of job {event.job_id} on the port of job {self.job_id}")
        self._publisher.publish(AGENT_SOURCE, event.kind, event.model_dump(mode="json"))

    def node(self, node_id: str) -> NodeView | None:
        key = {"job_id": {"S": self.job_id}, "node_id": {"S": node_id}}
        return _view(self._ddb.get_item(TableName=self._nodes, Key=key, **_READ).get("Item"), NodeView)

    def nodes(self) -> list[NodeView]:
        pages = self._ddb.get_paginator("query").paginate(
            TableName=self._nodes, KeyConditionExpression="job_id = :j",
            ExpressionAttributeValues={":j": {"S": self.job_id}}, **_READ)
        views = (_view(item, NodeView) for page in pages for item in page.get("Items", []))
        return [v for v in views if v is not None]

    def job(self) -> JobView | None:
        key = {"job_id": {"S": self.job_id}}
        return _view(self._ddb.get_item(TableName=self._jobs, Key=key, **_READ).get("Item"), JobView)

    def durable_root(self) -> str:
        return f"s3://{settings().bucket}/{RESOURCES.checkpoints_prefix}"
