"""EC2 Instance Rebalance Recommendation -> proactive checkpoint of the node's job.

Dedupe key: (instance, event time).
"""

from __future__ import annotations

import time
from typing import Any

from aws_lambda_powertools.utilities.parser import parse
from aws_lambda_powertools.utilities.typing import LambdaContext

from functions._runtime import controller, logger, once
from spotrelay.services.ec2_events import RebalanceEvent


@logger.inject_lambda_context(clear_state=True)
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    from spotrelay.services.interruptions import rebalance

    parsed = parse(event=event, model=RebalanceEvent)
    instance_id, at = parsed.detail.instance_id, parsed.time.timestamp()
    logger.append_keys(instance_id=instance_id)
    return once("rebalance", {"instance_id": instance_id, "time": at},
                lambda: rebalance(controller(), instance_id, at, time.time()), context)
