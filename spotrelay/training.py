"""The public training API: ``from spotrelay.training import spotrelay_session``.

User scripts import this module, never the agent's package: the agent is an implementation
detail of the node (and ``agent`` is too common a top-level name to claim in a user's
environment). Importing it needs the ``agent`` extra (torch). See docs/training-api.md.
"""

from __future__ import annotations

from agent.batching import BatchPlan, GlobalBatchSampler, plan_batch
from agent.checkpoint.config import SessionConfig
from agent.training import Session, spotrelay_session
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
    "plan_batch",
    "spotrelay_session",
]
