"""Workflow task: terminate every instance of the job (finish, cancel and the catch-all all come here)."""

from __future__ import annotations

import time
from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from functions._runtime import controller, logger
from spotrelay.services.task_payloads import TeardownTask


@logger.inject_lambda_context(clear_state=True)
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    task = TeardownTask.model_validate(event)
    logger.append_keys(job_id=task.job_id)
    from spotrelay.services.workflow_tasks import teardown

    return teardown(controller(), task.job_id, time.time())
