"""EC2 Instance State-change Notification (stopping, stopped, shutting-down, terminated) -> node
lost (unannounced) or gone (after a notice); the workflow's waits are settled.

Dedupe key: (instance, state).
"""

from __future__ import annotations

import time
from typing import Any

from aws_lambda_powertools.utilities.parser import parse
from aws_lambda_powertools.utilities.typing import LambdaContext

from functions._runtime import controller, logger, once
from spotrelay.services.ec2_events import InstanceStateEvent


@logger.inject_lambda_context(clear_state=True)
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    from spotrelay.services.interruptions import instance_state

    parsed = parse(event=event, model=InstanceStateEvent)
    instance_id, state = parsed.detail.instance_id, parsed.detail.state
    logger.append_keys(instance_id=instance_id, ec2_state=state)
    if state in ("pending", "running"):
        return {"result": "ignored", "why": f"state {state} is not a loss"}
    return once("instance_state", {"instance_id": instance_id, "state": state},
                lambda: instance_state(controller(), instance_id, state, time.time()), context)
