"""The grant analysis checked against what really happens: every handler runs on its real event sample
against moto with the production adapters, and every AWS call it makes must be one the static analysis
(tests/infrastructure/aws_calls.py, which test_grants.py holds the roles to) found for it."""

from __future__ import annotations

import contextlib
import importlib
import json
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.client import BaseClient

from cdk import staging
from tests.handler_samples import TASK_ORDER, first_event
from tests.infrastructure import aws_calls

JOB = "grants-runtime-job"


@pytest.fixture
def recorded(aws: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Production adapters (no doubles) and every boto3 call as its IAM action."""
    from functions import _runtime
    from spotrelay.adapters.aws import client
    from spotrelay.settings import reset

    secret = client("secretsmanager").create_secret(
        Name="grants-runtime-slack", SecretString=json.dumps({"webhook_url": "http://127.0.0.1:9/none"}))
    monkeypatch.setenv("SPOTRELAY_SLACK_SECRET_ARN", secret["ARN"])
    monkeypatch.setenv("SPOTRELAY_STATE_MACHINE_ARN", "arn:aws:states:us-east-1:123456789012:stateMachine:none")
    reset()
    _runtime.set_factories(compute=None, market=None, pool_stats=None, notifier=None, store=None, workflow=None,
                           objects=None)
    client("s3").put_object(Bucket=aws["bucket"], Key="submissions/llm-pretrain.yaml",
                            Body=(staging.ROOT / "examples" / "tiny.yaml").read_bytes())
    calls: list[str] = []
    original = BaseClient._make_api_call  # type: ignore[attr-defined]

    def recording(self: BaseClient, operation: str, params: dict[str, Any]) -> Any:
        action = f"{self.meta.service_model.signing_name}:{operation}"
        calls.append(aws_calls.ACTION_NAMES.get(action, action))
        return original(self, operation, params)

    monkeypatch.setattr(BaseClient, "_make_api_call", recording)
    yield calls
    _runtime.reset()
    monkeypatch.undo()
    reset()


def test_every_call_a_handler_makes_is_one_the_analysis_found(recorded: list[str]) -> None:
    from spotrelay.adapters.aws import client
    from spotrelay.local.lambda_seam import LambdaContext
    from spotrelay.settings import settings

    # submission first, the workflow's tasks in their order: they work on the job it recorded
    order = ["on_submission", *TASK_ORDER]
    handlers = sorted(staging.discover_handlers(), key=lambda h: order.index(h) if h in order else len(order))
    static = aws_calls.handler_calls(handlers)
    unexplained, silent = [], []
    job_id = JOB
    for handler in handlers:
        recorded.clear()
        event = first_event(handler, job_id)
        module = importlib.import_module(f"functions.{handler}")
        with contextlib.suppress(Exception):  # no state machine, an unreachable webhook: the calls were made
            module.handler(event, LambdaContext(f"spotrelay-{handler}"))
        made = set(recorded)
        if handler == "on_submission":  # the job it recorded (its execution could not start: no machine)
            items = client("dynamodb").scan(TableName=settings().jobs_table)["Items"]
            job_id = items[0]["job_id"]["S"] if items else job_id
        unexplained += [f"{handler}: called {a}, which tests/infrastructure/aws_calls.py did not find"
                        for a in sorted(made - set(static[handler]))]
        if not made:
            silent.append(handler)
    assert not unexplained, "\n".join(unexplained)
    assert not silent, f"these handlers made no AWS call on their sample, so nothing was checked: {silent}"


def test_every_call_the_agent_port_makes_is_in_the_per_job_policy_and_nothing_more(recorded: list[str]) -> None:
    """The agent's side: what its port (the AWS adapter) really calls on moto is what the per-job
    policy grants on the tables and the bus, read-only on DynamoDB; the policy grants no table action
    the port does not make."""
    from spotrelay.adapters.aws_agent_port import AwsAgentPort
    from spotrelay.adapters.dynamodb_job_store import DynamoDBJobStore
    from spotrelay.adapters.iam_job_profile import JobProfileConfig, job_policy
    from spotrelay.contracts.events import NodeReady
    from spotrelay.domain.models import Job, Node, Pool
    from spotrelay.domain.status import JobStatus

    store = DynamoDBJobStore()
    store.create_job(Job(job_id=JOB, name="agent", status=JobStatus.RUNNING, attempt=1))
    store.put_node(Node(job_id=JOB, node_id="a1-r0", attempt=1, rank=0, instance_id="i-0agent",
                        pool=Pool(region="us-east-1", az="us-east-1a", instance_type="p5.48xlarge", market="spot")))
    recorded.clear()
    port = AwsAgentPort(JOB)
    assert port.node("a1-r0") is not None and port.nodes() and port.job() is not None
    port.report(NodeReady(event_id="evt-grants-1", job_id=JOB, node_id="a1-r0", instance_id="i-0agent", attempt=1,
                          rank=0, time=1.0, private_ip="10.0.0.1", region="us-east-1", az="us-east-1a"))
    made = set(recorded)
    granted = {a for s in job_policy(JobProfileConfig(), JOB)["Statement"]
               for a in (s["Action"] if isinstance(s["Action"], list) else [s["Action"]])}
    assert made <= granted, f"the agent's port calls {sorted(made - granted)}, which its policy does not grant"
    assert {a for a in granted if a.startswith(("dynamodb:", "events:"))} == made
    assert not any(a.startswith("dynamodb:") and not a.endswith(("GetItem", "Query")) for a in granted)
