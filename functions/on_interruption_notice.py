"""EC2 Spot Instance Interruption Warning -> doom the node, CHECKPOINT_NOW to every rank, cool the pool.

Dedupe key: (instance, notice time); EventBridge redeliveries and the duplicate a second region's
forwarding rule may produce collapse onto it (DESIGN.md section 3).
"""

from __future__ import annotations

import time
from typing import Any

from aws_lambda_powertools.utilities.parser import parse
from aws_lambda_powertools.utilities.typing import LambdaContext

from functions._runtime import controller, logger, once
from spotrelay.services.ec2_events import SpotInterruptionEvent


@logger.inject_lambda_context(clear_state=True)
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    from spotrelay.services.interruptions import interruption_notice

    notice = parse(event=event, model=SpotInterruptionEvent)
    instance_id, at = notice.detail.instance_id, notice.time.timestamp()
    logger.append_keys(instance_id=instance_id)
    return once("interruption_notice", {"instance_id": instance_id, "time": at},
                lambda: interruption_notice(controller(), instance_id, at, time.time()), context)
