"""Workflow task: gang-launch in the first candidate pool with capacity (capacity errors propagate);
or, from the Prewarm state, one rebalance standby; or, from the Migrate state, a review's move (the one
function that launches)."""

from __future__ import annotations

import time
from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from functions._runtime import controller, logger
from spotrelay.services.task_payloads import ProvisionTask


@logger.inject_lambda_context(clear_state=True)
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    task = ProvisionTask.model_validate(event)
    logger.append_keys(job_id=task.job_id)
    if task.standby is not None:  # the Prewarm state (recovery.prewarm_on_rebalance)
        from spotrelay.services.prewarm import prewarm

        return prewarm(controller(), task.job_id, task.standby, time.time())
    if task.move is not None:  # the Migrate state: a review's move, make-before-break
        from spotrelay.services.migrate import migrate

        return migrate(controller(), task.job_id, task.move, time.time(), task.timings).model_dump(mode="json")
    from spotrelay.services.workflow_tasks import provision

    assert task.plan is not None
    return provision(controller(), task.job_id, task.plan, time.time(), task.timings).model_dump(mode="json")
