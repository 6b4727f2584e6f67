"""Placement: where to launch a gang. Pure; the formula is in docs/placement.md.

Stable API (the workflow, the twin and the simulator code against these names):

- ``rank_pools(spec, quotes, stats, now, excluded=frozenset(), *, quotas=None, config=DEFAULT_CONFIG)
  -> list[ScoredPool]``: candidate pools best first. ``quotes`` come from a ``MarketData`` port,
  ``stats`` from ``PoolStatsStore.get_many(...)`` (keyed by ``Pool.key``), ``excluded`` are pool keys
  the caller refuses (pools that just failed in this workflow run), ``quotas`` maps
  ``"<region>/<market>"`` to vCPUs still available. Pools cooling down, excluded, over
  ``max_hourly_price`` or outside the spec's regions/types/markets are dropped.
- ``best_pool(...)`` same arguments -> the first ``ScoredPool`` or ``NoPlacementError`` with reasons.
- ``evaluate_pools(...)`` -> ``Ranking(ranked, dropped)`` when you also want why pools were dropped.
- ``ScoredPool``: ``pool`` (``Pool``), ``quote`` (``PoolQuote``), ``score`` (expected USD per useful
  training hour for the whole gang; lower is better) and ``breakdown`` (the terms, for logs/notices).
- ``PoolStats``, ``PoolStatsStore`` (``get_many``, ``all``, ``record(pool_key, event, now, hours=0)``),
  ``InMemoryPoolStatsStore``, ``PoolEvent`` (LAUNCHED, INTERRUPTED, CAPACITY_FAILURE, QUOTA_EXCEEDED,
  OBSERVED), ``CooldownPolicy``, ``apply_event`` (pure), ``cooling_down``.
- ``catalog``: the static table of prices, Spot Advisor bands and instance facts.

Recording events (who calls what): provisioning records LAUNCHED / CAPACITY_FAILURE /
QUOTA_EXCEEDED for the pool it tried; the interruption handler records INTERRUPTED once per
instance; when an attempt ends, record OBSERVED with ``hours = nodes * hours run``.
"""

from __future__ import annotations

from spotrelay.placement import catalog
from spotrelay.placement.cooldown import CooldownPolicy, PoolEvent, apply_event, cooling_down
from spotrelay.placement.policy import (
    DEFAULT_CONFIG,
    PlacementConfig,
    Ranking,
    ScoredPool,
    best_pool,
    evaluate_pools,
    rank_pools,
    score_pool,
)
from spotrelay.placement.pool_stats import InMemoryPoolStatsStore, PoolStats, PoolStatsStore, empty_stats

__all__ = [
    "DEFAULT_CONFIG",
    "CooldownPolicy",
    "InMemoryPoolStatsStore",
    "PlacementConfig",
    "PoolEvent",
    "PoolStats",
    "PoolStatsStore",
    "Ranking",
    "ScoredPool",
    "apply_event",
    "best_pool",
    "catalog",
    "cooling_down",
    "empty_stats",
    "evaluate_pools",
    "rank_pools",
    "score_pool",
]
