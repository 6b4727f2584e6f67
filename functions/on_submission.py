"""S3 "Object Created" under submissions/ (via EventBridge) -> validate, record, start the workflow.

Dedupe key: (key, etag). The job id is derived from it and the job is created conditionally, so a
redelivered event finds its job and starts nothing twice; S3's sequencer tells a redelivery from
the same file dropped again (see spotrelay/services/submit.py).
"""

from __future__ import annotations

import time
from typing import Any

from aws_lambda_powertools.utilities.parser import parse
from aws_lambda_powertools.utilities.parser.models import S3EventNotificationEventBridgeModel
from aws_lambda_powertools.utilities.typing import LambdaContext

from functions._runtime import controller, logger, objects


@logger.inject_lambda_context(clear_state=True)
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    from spotrelay.services.submit import submit

    obj = parse(event=event, model=S3EventNotificationEventBridgeModel).detail.object
    logger.append_keys(key=obj.key)
    ports = controller()
    size = None if obj.size is None else int(obj.size)
    result = submit(obj.key, obj.etag or "", size, store=ports.store, objects=objects(),
                    workflow=ports.workflow, now=time.time(), notifier=ports.notifier, sequencer=obj.sequencer)
    logger.append_keys(job_id=result.job_id)
    logger.info("submission handled", extra=result.as_dict())
    return result.as_dict()
