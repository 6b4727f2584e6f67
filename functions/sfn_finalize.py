"""Workflow task: record SUCCEEDED, FAILED (with the reason) or CANCELLED and notify."""

from __future__ import annotations

import time
from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from functions._runtime import controller, logger
from spotrelay.services.task_payloads import FinalizeTask


@logger.inject_lambda_context(clear_state=True)
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    task = FinalizeTask.model_validate(event)
    logger.append_keys(job_id=task.job_id)
    from spotrelay.services.workflow_tasks import finalize

    return finalize(controller(), task.job_id, task.result, time.time(), error=task.error)
