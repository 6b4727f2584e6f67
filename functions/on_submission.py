"""S3 "Object Created" under submissions/ (via EventBridge) -> validate, record, start the workflow."""

from __future__ import annotations

import time
from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.parser import parse
from aws_lambda_powertools.utilities.parser.models import S3EventNotificationEventBridgeModel
from aws_lambda_powertools.utilities.typing import LambdaContext

logger = Logger(service="spotrelay")


@logger.inject_lambda_context
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    from functions import _submission_deps as deps
    from spotrelay.services.submit import submit

    parsed = parse(event=event, model=S3EventNotificationEventBridgeModel)
    obj = parsed.detail.object
    logger.append_keys(key=obj.key)
    result = submit(
        obj.key, obj.etag or "", int(obj.size or 0),
        store=deps.store(), objects=deps.objects(), workflow=deps.workflow(), now=time.time(),
        notifier=deps.notifier(),
    )
    logger.info("submission handled", extra=result.as_dict())
    return result.as_dict()
