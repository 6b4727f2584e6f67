"""Workflow task: start the job's next execution before this one's history fills (services/handover.py)."""

from __future__ import annotations

import time
from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from functions._runtime import controller, logger
from spotrelay.services.task_payloads import HandOverTask


@logger.inject_lambda_context(clear_state=True)
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    task = HandOverTask.model_validate(event)
    logger.append_keys(job_id=task.job_id)
    from spotrelay.services.handover import hand_over

    return hand_over(controller(), task.job_id, task.resume_at, task.data, time.time())
