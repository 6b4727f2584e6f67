"""Notifier on SNS: one message per job event, JSON body, ``kind`` and ``job_id`` as message
attributes so subscribers (the Slack forwarder, email filters) can filter without parsing."""

from __future__ import annotations

import json
from typing import Any

from botocore.exceptions import ClientError

from spotrelay.adapters.aws import client, error_code
from spotrelay.errors import NotFoundError, PermanentError, RetryableError
from spotrelay.settings import settings

SUBJECT_LIMIT = 100  # SNS rejects longer subjects


class SnsNotifier:
    def __init__(self, topic_arn: str | None = None) -> None:
        self._topic = topic_arn

    def notify(self, kind: str, job_id: str, subject: str, context: dict[str, Any],
               topic_arn: str | None = None) -> None:
        topic = topic_arn or self._topic or settings().topic_arn
        if not topic:
            raise PermanentError("no SNS topic: set SPOTRELAY_TOPIC_ARN or the spec's notifications.sns_topic_arn")
        body = {"kind": kind, "job_id": job_id, "subject": subject, "context": context}
        subject_line = "".join(c if c.isprintable() else " " for c in subject)[:SUBJECT_LIMIT]
        try:
            client("sns").publish(
                TopicArn=topic, Subject=subject_line, Message=json.dumps(body, default=str),
                MessageAttributes={"kind": {"DataType": "String", "StringValue": kind},
                                   "job_id": {"DataType": "String", "StringValue": job_id}},
            )
        except ClientError as exc:
            code = error_code(exc)
            if code == "NotFound":
                raise NotFoundError(f"SNS topic {topic} does not exist") from exc
            if code in ("Throttling", "ThrottlingException", "InternalError"):
                raise RetryableError(f"SNS publish throttled ({code})") from exc
            raise
