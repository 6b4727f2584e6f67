"""Notifications: SNS messages with context (moto SNS -> SQS subscription shows what subscribers
get), and the Slack subscriber posting to a webhook kept in Secrets Manager (a local HTTP server)."""

from __future__ import annotations

import copy
import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest

from functions import slack_notifier
from spotrelay.adapters.aws import client
from spotrelay.adapters.sns_notifier import SnsNotifier
from spotrelay.domain.models import CheckpointRef, Job
from spotrelay.domain.status import JobStatus
from spotrelay.services.notify import announce
from spotrelay.settings import reset
from tests.integration.controller_doubles import ctx, load_event


class Webhook:
    def __init__(self, status: int = 200) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.status = status
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers["Content-Length"])
                outer.bodies.append(json.loads(self.rfile.read(length)))
                self.send_response(outer.status)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/services/T000/B000/XXXX"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def slack(aws: dict[str, str]) -> Iterator[Webhook]:
    hook = Webhook()
    arn = client("secretsmanager").create_secret(
        Name="spotrelay/slack-webhook", SecretString=json.dumps({"webhook_url": hook.url}))["ARN"]
    os.environ["SPOTRELAY_SLACK_SECRET_ARN"] = arn
    reset()
    slack_notifier._cache.clear()
    yield hook
    hook.server.shutdown()
    os.environ.pop("SPOTRELAY_SLACK_SECRET_ARN", None)
    reset()


def _job() -> Job:
    return Job(job_id="llama-1", name="llama", status=JobStatus.RECOVERING, attempt=2, recoveries=1, steps_lost=7,
               last_step=1049, cost_so_far=412.8,
               last_checkpoint=CheckpointRef(step=1042, uri="s3://b/c/step-1042/", committed_at=1000.0))


def _subscribe(topic_arn: str) -> str:
    sqs = client("sqs")
    url = sqs.create_queue(QueueName="notifications-probe")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    client("sns").subscribe(TopicArn=topic_arn, Protocol="sqs", Endpoint=queue_arn)
    return str(url)


def test_sns_message_carries_context(aws: dict[str, str]) -> None:
    url = _subscribe(aws["topic_arn"])
    sent = announce(SnsNotifier(), "interrupted", _job(), 1031.5, reason="spot interruption of ranks [0]")
    assert sent is not None
    messages = client("sqs").receive_message(QueueUrl=url, WaitTimeSeconds=1)["Messages"]
    envelope = json.loads(messages[0]["Body"])
    assert envelope["Subject"] == "spotrelay: job llama interrupted: spot interruption of ranks [0]"
    assert envelope["MessageAttributes"]["kind"]["Value"] == "interrupted"
    body = json.loads(envelope["Message"])
    assert body["kind"] == "interrupted" and body["job_id"] == "llama-1"
    context = body["context"]
    assert context["attempt"] == 2 and context["steps_lost"] == 7 and context["cost_so_far"] == 412.8
    assert context["checkpoint_step"] == 1042 and context["checkpoint_age_s"] == 31.5


def test_a_broken_notifier_never_breaks_the_job(aws: dict[str, str]) -> None:
    missing = SnsNotifier("arn:aws:sns:us-east-1:123456789012:no-such-topic")
    assert announce(missing, "failed", _job(), 0.0) is not None  # logged, not raised


def test_slack_posts_each_sns_record(slack: Webhook) -> None:
    result = slack_notifier.handler(load_event("sns_notification.json"), ctx())
    assert result == {"posted": 1}
    body = slack.bodies[0]
    assert body["text"].startswith(":warning: spotrelay: job llama-pretrain interrupted")
    facts = body["blocks"][1]["text"]["text"]
    assert "*Attempt:* 1" in facts and "*Cost so far (USD):* 412.8" in facts and "*Checkpoint step:* 1042" in facts


def _relay_to_slack(url: str) -> None:
    """What SNS does with the message the notifier published: hand it to the Slack notifier's handler
    (the topic's SQS subscription ``url`` shows what SNS would deliver)."""
    envelope = json.loads(client("sqs").receive_message(QueueUrl=url, WaitTimeSeconds=1)["Messages"][0]["Body"])
    event = copy.deepcopy(load_event("sns_notification.json"))
    event["Records"][0]["Sns"].update({"Message": envelope["Message"], "Subject": envelope["Subject"],
                                       "MessageId": envelope["MessageId"]})
    slack_notifier.handler(event, ctx())


def test_slack_end_to_end_from_the_sns_notifier(aws: dict[str, str], slack: Webhook) -> None:
    url = _subscribe(aws["topic_arn"])
    failed = _job().model_copy(update={"status": JobStatus.FAILED, "reasons": ["RetryBudgetExhaustedError: spent"]})
    announce(SnsNotifier(), "failed", failed, 1031.5)
    _relay_to_slack(url)
    posted = slack.bodies[0]
    assert posted["text"] == ":x: spotrelay: job llama failed"
    assert "*Why:* RetryBudgetExhaustedError: spent" in posted["blocks"][1]["text"]["text"]
    assert "channel" not in posted  # no channel in the spec: the webhook's own


def test_the_specs_slack_channel_reaches_the_post(aws: dict[str, str], slack: Webhook) -> None:
    """notifications.slack_channel was validated and then sent nowhere: every job posted to the webhook's
    channel."""
    url = _subscribe(aws["topic_arn"])
    job = _job().model_copy(update={"status": JobStatus.FAILED,
                                    "spec": {**(_job().spec or {}), "notifications": {"slack_channel": "#ml-alerts"}}})
    announce(SnsNotifier(), "failed", job, 1031.5)
    _relay_to_slack(url)
    assert slack.bodies[0]["channel"] == "#ml-alerts"


def test_slack_failure_raises_so_sns_retries(slack: Webhook) -> None:
    slack.status = 500
    with pytest.raises(Exception, match="500"):
        slack_notifier.handler(load_event("sns_notification.json"), ctx())


def test_eventbridge_publisher_delivers_agent_events_to_the_rule(aws: dict[str, str]) -> None:
    from spotrelay.adapters.eventbridge_publisher import EventBridgePublisher
    from spotrelay.resources import RULES

    sqs, events = client("sqs"), client("events")
    url = sqs.create_queue(QueueName="agent-events-probe")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    rule = next(r for r in RULES if r.handler == "on_agent_event")
    events.put_rule(Name="probe", EventPattern=json.dumps(rule.pattern), State="ENABLED")
    events.put_targets(Rule="probe", Targets=[{"Id": "q", "Arn": arn}])
    detail = load_event("agent_heartbeat.json")["detail"]
    EventBridgePublisher().publish("spotrelay.agent", "Heartbeat", detail)
    body = json.loads(client("sqs").receive_message(QueueUrl=url, WaitTimeSeconds=2)["Messages"][0]["Body"])
    assert body["source"] == "spotrelay.agent" and body["detail-type"] == "Heartbeat" and body["detail"] == detail


def test_eventbridge_publisher_reports_a_missing_bus(aws: dict[str, str]) -> None:
    from spotrelay.adapters.eventbridge_publisher import EventBridgePublisher
    from spotrelay.errors import NotFoundError

    with pytest.raises(NotFoundError, match="no-such-bus"):
        EventBridgePublisher(bus_name="no-such-bus").publish("spotrelay.agent", "Heartbeat", {"x": 1})
