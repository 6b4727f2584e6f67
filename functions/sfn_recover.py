"""Workflow task: record the ended attempt, charge the retry budget, release nodes, compute the backoff."""

from __future__ import annotations

import time
from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from functions._runtime import controller, logger
from spotrelay.services.task_payloads import RecoverTask


@logger.inject_lambda_context(clear_state=True)
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    task = RecoverTask.model_validate(event)
    logger.append_keys(job_id=task.job_id)
    from spotrelay.services.recovery_flow import recover

    return recover(controller(), task.job_id, task.outcome, task.timings, time.time()).model_dump(mode="json")
