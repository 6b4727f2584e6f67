"""Workflow task: keep the task token of a wait (ready / outcome) on the job; settle it if already decided."""

from __future__ import annotations

import time
from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from functions._runtime import controller, logger
from spotrelay.services.task_payloads import RegisterWaitTask


@logger.inject_lambda_context(clear_state=True)
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    task = RegisterWaitTask.model_validate(event)
    logger.append_keys(job_id=task.job_id)
    from spotrelay.services.waits import register_wait

    return register_wait(controller(), task.job_id, task.wait, task.attempt, task.task_token, time.time())
