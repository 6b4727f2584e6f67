"""The public training API: ``from spotrelay.training import spotrelay_session``.

User scripts import this module, never the agent's package: the agent is an implementation
detail of the node (and ``agent`` is too common a top-level name to claim in a user's
environment). Importing it needs the ``agent`` extra (torch). See docs/training-api.md.
"""

from __future__ import annotations

import json
import os
from typing import Any

from agent.batching import BatchPlan, GlobalBatchSampler, plan_batch
from agent.checkpoint.config import SessionConfig
from agent.training import Session, spotrelay_session
from spotrelay.contracts.control import ENV_DEEPSPEED_CONFIG
from spotrelay.contracts.exit_codes import ExitCode
from spotrelay.contracts.health import AnomalyKind, HealthAction, HealthAnomaly, HealthPolicy

__all__ = [
    "AnomalyKind",
    "BatchPlan",
    "ExitCode",
    "GlobalBatchSampler",
    "HealthAction",
    "HealthAnomaly",
    "HealthPolicy",
    "Session",
    "SessionConfig",
    "deepspeed_config",
    "plan_batch",
    "spotrelay_session",
]


def deepspeed_config() -> dict[str, Any]:
    """The job spec's ``launcher.deepspeed_config`` as a dict, for ``deepspeed.initialize(config=...)``:
    the agent writes an inline one to a file and names it in ``$SPOTRELAY_DEEPSPEED_CONFIG`` (a path in
    the spec is named as given, relative to ``working_dir``)."""
    path = os.environ.get(ENV_DEEPSPEED_CONFIG)
    if not path:
        raise RuntimeError(f"${ENV_DEEPSPEED_CONFIG} is not set: the job spec has no launcher.deepspeed_config "
                           "(or this process was not started by the spotrelay agent)")
    with open(path, encoding="utf-8") as f:
        config: dict[str, Any] = json.load(f)
    return config
