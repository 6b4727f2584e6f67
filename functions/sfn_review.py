"""Workflow task: the placement review at the outcome wait's timeout (stay, or move make-before-break)."""

from __future__ import annotations

import time
from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from functions._runtime import controller, logger
from spotrelay.services.task_payloads import ReviewTask


@logger.inject_lambda_context(clear_state=True)
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    task = ReviewTask.model_validate(event)
    logger.append_keys(job_id=task.job_id)
    from spotrelay.services.review import review

    return review(controller(), task.job_id, task.attempt, time.time(), task.timings,
                  task.review_s, task.review_mark, task.review_backoff, task.polls).model_dump(mode="json")
