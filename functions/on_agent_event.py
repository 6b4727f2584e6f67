"""Agent events (EventBridge source ``spotrelay.agent``) -> node/job updates and task-token completions.

Dedupe key: the agent's event id (DESIGN.md section 3).
"""

from __future__ import annotations

import time
from typing import Any

from aws_lambda_powertools.utilities.parser import parse
from aws_lambda_powertools.utilities.parser.models import EventBridgeModel
from aws_lambda_powertools.utilities.typing import LambdaContext

from functions._runtime import controller, logger, once
from spotrelay.contracts.events import parse_agent_event


@logger.inject_lambda_context(clear_state=True)
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    from spotrelay.services.node_events import handle_agent_event

    parse(event=event, model=EventBridgeModel)  # a well-formed EventBridge envelope
    agent_event = parse_agent_event(event["detail"])
    logger.append_keys(job_id=agent_event.job_id, node_id=agent_event.node_id, kind=agent_event.kind)
    return once("agent_event", {"event_id": agent_event.event_id},
                lambda: handle_agent_event(controller(), agent_event, time.time()), context)
