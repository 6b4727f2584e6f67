"""SNS subscriber: post each spotrelay notification to Slack.

The incoming-webhook URL lives in Secrets Manager (``SPOTRELAY_SLACK_SECRET_ARN``), as the plain
URL or as JSON ``{"webhook_url": ...}``; it is fetched on first use and cached for 5 minutes.
A failed post raises, so SNS retries the delivery.
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any

from aws_lambda_powertools.utilities.parser import parse
from aws_lambda_powertools.utilities.parser.models import SnsModel
from aws_lambda_powertools.utilities.typing import LambdaContext

from functions._runtime import logger

_cache: dict[str, Any] = {}


def webhook_url() -> str:
    from aws_lambda_powertools.utilities.parameters import SecretsProvider

    from spotrelay.adapters.aws import client
    from spotrelay.settings import settings

    arn = settings().slack_secret_arn
    if not arn:
        raise RuntimeError("SPOTRELAY_SLACK_SECRET_ARN is not set")
    if "provider" not in _cache:
        _cache["provider"] = SecretsProvider(boto3_client=client("secretsmanager"))
    raw = str(_cache["provider"].get(arn, max_age=300))
    url = json.loads(raw)["webhook_url"] if raw.lstrip().startswith("{") else raw.strip()
    if not url.startswith(("https://", "http://127.0.0.1")):
        raise ValueError("the Slack webhook URL must be https")
    return str(url)


def post(url: str, body: dict[str, Any]) -> int:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as response:
        return int(response.status)


@logger.inject_lambda_context(clear_state=True)
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    from spotrelay.services.notify import slack_payload

    posted = 0
    for record in parse(event=event, model=SnsModel).Records:
        message = json.loads(str(record.Sns.Message))
        logger.append_keys(job_id=message.get("job_id"), kind=message.get("kind"))
        post(webhook_url(), slack_payload(message))
        posted += 1
    return {"posted": posted}
