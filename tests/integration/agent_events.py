"""The controller's side of real agents in integration tests: an EventBridge rule on source
``spotrelay.agent`` -> an SQS queue that a thread serves with the controller's real handler
(``handle_agent_event``, as on_agent_event does). The agents write no record: this is the one writer
of the node and job items the tests check."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from spotrelay.adapters.aws import client
from spotrelay.adapters.dynamodb_job_store import DynamoDBJobStore
from spotrelay.contracts.events import AGENT_SOURCE, parse_agent_event
from spotrelay.services.controller import Controller
from spotrelay.services.node_events import handle_agent_event


class AgentEvents:
    """Serves the agents' events with the controller's handler, keeping what it saw."""

    def __init__(self, store: DynamoDBJobStore) -> None:
        self.ctl = Controller(store=store)
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        sqs = client("sqs")
        self.url = sqs.create_queue(QueueName="agent-events")["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=self.url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        events = client("events")
        events.put_rule(Name="agent-events", EventPattern=json.dumps({"source": [AGENT_SOURCE]}))
        events.put_targets(Rule="agent-events", Targets=[{"Id": "q", "Arn": arn}])
        self.seen: list[tuple[str, Any]] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stopped.wait(0.2):
            self.drain()

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(10)

    def drain(self) -> list[tuple[str, Any]]:
        sqs = client("sqs")
        with self.lock:
            while True:
                got = sqs.receive_message(QueueUrl=self.url, MaxNumberOfMessages=10).get("Messages", [])
                if not got:
                    return list(self.seen)
                for message in got:
                    body = json.loads(message["Body"])
                    event = parse_agent_event(body["detail"])
                    handle_agent_event(self.ctl, event, time.time())
                    self.seen.append((body["detail-type"], event))
                    sqs.delete_message(QueueUrl=self.url, ReceiptHandle=message["ReceiptHandle"])

    def of(self, kind: str, attempt: int) -> list[Any]:
        return [e for k, e in self.drain() if k == kind and e.attempt == attempt]
