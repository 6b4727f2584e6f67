"""Scheduled every minute: stale heartbeats -> node lost, orphan instances -> terminated, stuck
executions -> FAILED. Dedupe key: the schedule's run time.

Environment: ``SPOTRELAY_STALE_HEARTBEAT_S`` (default 300), ``SPOTRELAY_STUCK_AFTER_S`` (default
3600), ``SPOTRELAY_HEAL_AFTER_S`` (default 180: a submission left half-way longer is finished),
``SPOTRELAY_REGIONS`` (comma list of regions to sweep besides those of live jobs; default the home
region), ``SPOTRELAY_RECONCILE_S`` (default 60: the schedule's period; a budget stops a sweep and a
save ahead of it).
"""

from __future__ import annotations

import os
import time
from typing import Any

from aws_lambda_powertools.utilities.parser import parse
from aws_lambda_powertools.utilities.parser.models import EventBridgeModel
from aws_lambda_powertools.utilities.typing import LambdaContext

from functions._runtime import controller, logger, once, reconcile_s


@logger.inject_lambda_context(clear_state=True)
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    from spotrelay.services.reconcile import reconcile
    from spotrelay.settings import settings

    run = parse(event=event, model=EventBridgeModel)
    stale = float(os.environ.get("SPOTRELAY_STALE_HEARTBEAT_S") or 300)
    stuck = float(os.environ.get("SPOTRELAY_STUCK_AFTER_S") or 3600)
    heal = float(os.environ.get("SPOTRELAY_HEAL_AFTER_S") or 180)
    regions = [r for r in (os.environ.get("SPOTRELAY_REGIONS") or settings().region).split(",") if r]
    return once("reconcile", {"time": run.time.isoformat()},
                lambda: reconcile(controller(), time.time(), stale_after_s=stale, regions=regions,
                                          stuck_after_s=stuck, heal_after_s=heal, sweep_s=reconcile_s()), context)
