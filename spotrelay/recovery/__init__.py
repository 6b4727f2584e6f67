"""Recovery: what to do when an attempt ends early. Pure; no I/O, no clock.

Stable API (the workflow's recover step calls them in this order):

1. ``classify_nodes(nodes, cancelled=False) -> AttemptEnd`` (or ``classify_attempt(exit_codes,
   doomed_ranks, lost_ranks, cancelled)``): ``AttemptEnd.outcome`` is a ``Verdict`` (succeeded,
   interrupted, node-lost, user-error, infra-error, cancelled), with ``reason``, ``exit_code``,
   ``rank`` and ``lost_ranks`` (ranks whose nodes must be replaced). ``AttemptEnd`` and ``Verdict``
   live in ``spotrelay/contracts/recovery.py``: ``settle`` classifies once and the workflow carries it.
2. ``check_retry_budget(spec.recovery, outcome, job.recoveries, job.user_restarts) -> RetryDecision``
   (``charge``: recovery | user-restart, the counters after this retry, a reason), or
   ``RetryBudgetExhaustedError`` naming the limit; the workflow marks the job FAILED with it.
3. ``plan_recovery(RecoveryContext(spec=..., outcome=..., nodes=gang, quotes=..., stats=..., now=...,
   excluded=...)) -> RecoveryPlan`` with the strategy the spec names. The plan says ``action``
   (new-cluster | replace-lost | restart-in-place), ``pool``, ``scored``, ``launch_ranks`` (launch
   these ranks, in this order, with ``LaunchRequest(ranks=...)``), ``keep_instance_ids`` and
   ``terminate_instance_ids``. ``NoPlacementError`` when no pool is left.

Strategies (``strategy_names()``): ``replace-cluster`` (new gang in the best pool) and
``replace-lost-nodes`` (keep survivors, launch only lost ranks in the same pool; a new gang when that
pool cools down or another is cheaper per useful hour). Add one with ``@register("name")``.
The EC2 adapter names the cluster placement group per job and AZ, so replacements in the same pool
join the survivors' group.
"""

from __future__ import annotations

from spotrelay.contracts.recovery import AttemptEnd, Verdict
from spotrelay.recovery.budget import Charge, RetryDecision, check_retry_budget, stall
from spotrelay.recovery.classify import classify_attempt, classify_nodes
from spotrelay.recovery.strategies import (
    RecoveryContext,
    RecoveryPlan,
    RecoveryStrategy,
    ReplaceCluster,
    ReplaceLostNodes,
    get_strategy,
    plan_recovery,
    register,
    strategy_names,
)

__all__ = [
    "AttemptEnd",
    "Charge",
    "RecoveryContext",
    "RecoveryPlan",
    "RecoveryStrategy",
    "ReplaceCluster",
    "ReplaceLostNodes",
    "RetryDecision",
    "Verdict",
    "check_retry_budget",
    "classify_attempt",
    "classify_nodes",
    "get_strategy",
    "plan_recovery",
    "register",
    "stall",
    "strategy_names",
]
