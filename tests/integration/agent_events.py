"""Real agents in integration tests, both sides of them.

- :class:`AgentEvents`, the controller's side: an EventBridge rule on source ``spotrelay.agent`` ->
  an SQS queue that a thread serves with the controller's real handler (``handle_agent_event``, as
  on_agent_event does). The agents write no record: this is the one writer of the node and job
  items the tests check.
- :class:`Instances`, the instances' side: a fake IMDS and a real agent process (``agent.main``)
  per instance; ``stop`` ends whatever a test left running.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from spotrelay.adapters.aws import client
from spotrelay.adapters.dynamodb_job_store import DynamoDBJobStore
from spotrelay.contracts.events import AGENT_SOURCE, parse_agent_event
from spotrelay.local.fake_imds import FakeImds
from spotrelay.services.controller import Controller
from spotrelay.services.node_events import handle_agent_event
from tests.conftest import ROOT


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


class Instances:
    """Test instances: a fake IMDS and an agent process each, in launch order, by instance id."""

    def __init__(self) -> None:
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.imds: dict[str, FakeImds] = {}

    def start(self, iid: str, az: str, work_dir: Path, settings: dict[str, Any]) -> subprocess.Popen[bytes]:
        """An instance ``iid`` whose agent gets ``settings`` (as SPOTRELAY_AGENT_*), its own IMDS and
        ``work_dir`` (the agent's log goes to ``work_dir/agent.log``)."""
        imds = FakeImds(instance_id=iid, az=az).start()
        self.imds[iid] = imds
        agent = {"imds_endpoint": imds.url, "work_dir": work_dir, **settings}
        env = {**os.environ, **{f"SPOTRELAY_AGENT_{k.upper()}": str(v) for k, v in agent.items()}}
        work_dir.mkdir(parents=True, exist_ok=True)
        with open(work_dir / "agent.log", "wb") as log:  # the child keeps its own descriptor
            proc = subprocess.Popen([sys.executable, "-m", "agent.main"], cwd=ROOT, env=env, stdout=log,
                                    stderr=subprocess.STDOUT)  # fmt: skip
        self.procs[iid] = proc
        return proc

    def stop(self) -> None:
        """Kill every agent still running and stop every IMDS (a test's teardown)."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for imds in self.imds.values():
            imds.stop()
