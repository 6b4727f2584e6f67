"""Workflow task: score the pools and pick this attempt's candidates (DESIGN.md section 4)."""

from __future__ import annotations

import time
from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from functions._runtime import controller, logger, reconcile_s
from spotrelay.services.task_payloads import PlanTask


@logger.inject_lambda_context(clear_state=True)
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    task = PlanTask.model_validate(event)
    logger.append_keys(job_id=task.job_id)
    from spotrelay.services.plan import plan

    return plan(controller(), task.job_id, time.time(), recovery=task.recovery,
                time_scale=task.timings.time_scale, sweep_s=reconcile_s()).model_dump(mode="json")
