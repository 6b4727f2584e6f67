"""Recovery strategies, registered by name; the job spec's ``recovery.strategy`` picks one.

A strategy is a small pure class: given how the attempt ended, the gang's nodes and the market, it
returns a ``RecoveryPlan`` (where to launch which ranks, which instances to keep or terminate).
Placement scoring is the same ``rank_pools`` the first launch uses.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from spotrelay.contracts.exit_codes import ExitCode
from spotrelay.contracts.recovery import AttemptEnd
from spotrelay.domain.models import Node, NodeState, Pool
from spotrelay.placement.policy import DEFAULT_CONFIG, PlacementConfig, ScoredPool, best_pool, evaluate_pools
from spotrelay.placement.pool_stats import PoolStats
from spotrelay.ports.market import PoolQuote
from spotrelay.spec.models import JobSpec

_GONE = (NodeState.DOOMED, NodeState.LOST, NodeState.TERMINATED)
# A rank that exited DONE or CANCELLED: its agent has left (agent/daemon.py ``serve``), so its node
# would never join another attempt; keeping it makes the next gang wait for a rank that never comes.
_AGENT_LEFT = (int(ExitCode.DONE), int(ExitCode.CANCELLED))


# spot survivors are kept through a recovery's backoff of at most this (a 30 s backoff doubling per short
# attempt: up to three in a row). Past it they would be billed idle through the wait, in the pool whose
# gangs keep dying, and often be reclaimed before their replacements come; the next gang is placed anew.
# Measured in docs/simulator-tuning.md, "Survivors through a backoff" (0 and 60 s: close; never: worse).
KEEP_BACKOFF_MAX_S = 120.0


class RecoveryContext(BaseModel):
    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)
    spec: JobSpec
    outcome: AttemptEnd
    nodes: list[Node]  # the gang of the attempt that ended (all ranks, any state)
    quotes: list[PoolQuote]
    stats: dict[str, PoolStats] = Field(default_factory=dict)
    now: float
    excluded: frozenset[str] = frozenset()
    quotas: dict[str, float] | None = None
    config: PlacementConfig = DEFAULT_CONFIG
    keep_margin: float = Field(0.05, ge=0, description="keep survivors unless another pool is this much cheaper")
    # the MarketData port's quotes with placement scores sized for k nodes (None: not asked): can the
    # survivors' pool take the lost ranks now?
    quotes_for: Callable[[int], Sequence[PoolQuote]] | None = None
    # the stall budget has one recovery left (placement/spot_evidence.last_chance): survivors on spot
    # are not kept, so Plan, which then offers on-demand, places the next gang
    last_chance: bool = False
    # seconds the workflow waits before its next launch (recovery_flow.recovery_backoff_s: 0 after a
    # notice, else the failure streak's backoff)
    backoff_s: float = Field(0.0, ge=0)

    def survivors(self) -> list[Node]:
        lost = set(self.outcome.lost_ranks)
        return sorted((n for n in self.nodes if n.rank not in lost and n.state not in _GONE
                       and not (n.state is NodeState.EXITED and n.exit_code in _AGENT_LEFT)), key=lambda n: n.rank)

    def release(self, keep: list[Node]) -> list[str]:
        """Instances of the gang not kept and not known gone (suspect nodes are released too)."""
        kept = {n.instance_id for n in keep}
        return [n.instance_id for n in sorted(self.nodes, key=lambda n: n.rank)
                if n.instance_id not in kept and n.state is not NodeState.TERMINATED]

    def lost_ranks(self) -> list[int]:
        alive = {n.rank for n in self.survivors()}
        return [r for r in range(self.spec.resources.nodes) if r not in alive]


class RecoveryPlan(BaseModel):
    model_config = ConfigDict(extra="forbid")
    strategy: str
    action: Literal["new-cluster", "replace-lost", "restart-in-place"]
    pool: Pool
    scored: ScoredPool | None = None  # the score of ``pool`` (None only when no market data was needed)
    launch_ranks: list[int]  # ranks to launch now, in launch order
    keep_instance_ids: list[str]  # survivors that stay in the gang
    terminate_instance_ids: list[str]  # every other instance of the gang not known to be terminated
    reason: str


class RecoveryStrategy(Protocol):
    name: str

    def plan(self, ctx: RecoveryContext) -> RecoveryPlan: ...


_REGISTRY: dict[str, Callable[[], RecoveryStrategy]] = {}


def register(name: str) -> Callable[[type], type]:
    def wrap(cls: type) -> type:
        if name in _REGISTRY:
            raise ValueError(f"recovery strategy '{name}' is registered twice")
        cls.name = name  # type: ignore[attr-defined]
        _REGISTRY[name] = cls
        return cls

    return wrap


def strategy_names() -> list[str]:
    return sorted(_REGISTRY)


def get_strategy(name: str) -> RecoveryStrategy:
    try:
        return _REGISTRY[name]()
    except KeyError:
        raise ValueError(f"unknown recovery strategy '{name}'; known: {strategy_names()}") from None


def plan_recovery(ctx: RecoveryContext) -> RecoveryPlan:
    """Plan with the strategy the spec names."""
    return get_strategy(ctx.spec.recovery.strategy).plan(ctx)


@register("replace-cluster")
class ReplaceCluster:
    """Release every survivor and launch a whole new gang in the best pool."""

    name: str

    def plan(self, ctx: RecoveryContext) -> RecoveryPlan:
        best = best_pool(ctx.spec, ctx.quotes, ctx.stats, ctx.now, ctx.excluded, quotas=ctx.quotas,
                         config=ctx.config)
        return self.new_cluster(ctx, best, f"{ctx.outcome.outcome}: new gang in {best.pool.key}")

    def new_cluster(self, ctx: RecoveryContext, best: ScoredPool, reason: str) -> RecoveryPlan:
        return RecoveryPlan(
            strategy=self.name, action="new-cluster", pool=best.pool, scored=best,
            launch_ranks=list(range(ctx.spec.resources.nodes)), keep_instance_ids=[],
            terminate_instance_ids=ctx.release([]), reason=reason,
        )


@register("replace-lost-nodes")
class ReplaceLostNodes(ReplaceCluster):
    """Keep survivors; launch only the lost ranks in the survivors' pool (same AZ, same placement
    group). The pool's cooldown (it was just interrupted) does not evict the healthy survivors: the
    interruption weighs in its score instead. Falls back to a new cluster when that pool is
    excluded or no longer quoted, or when another pool is cheaper per useful hour by more than
    ``keep_margin`` (a survivor is then released like any other node)."""

    def plan(self, ctx: RecoveryContext) -> RecoveryPlan:
        survivors = ctx.survivors()
        if not survivors:
            return super().plan(ctx)
        pools = {n.pool for n in survivors}
        if len(pools) != 1:
            return self._fallback(ctx, "survivors span several pools")
        home = pools.pop()
        if ctx.last_chance and home.market == "spot":
            return self._fallback(ctx, "one stalled recovery from the budget: not again on spot")
        if home.market == "spot" and ctx.backoff_s > KEEP_BACKOFF_MAX_S:
            return self._fallback(ctx, f"the next launch waits {ctx.backoff_s:g} s (gangs keep dying here): "
                                       "survivors would idle through it")
        ranking = evaluate_pools(ctx.spec, ctx.quotes, ctx.stats, ctx.now, ctx.excluded, quotas=ctx.quotas,
                                 config=ctx.config, running=frozenset({home.key}))
        if home.key in ranking.dropped:
            return self._fallback(ctx, f"pool {home.key} is not usable: {ranking.dropped[home.key]}")
        same = next((s for s in ranking.ranked if s.pool == home), None)
        if same is None:
            return self._fallback(ctx, f"pool {home.key} has no quote")
        best = ranking.ranked[0]
        if same.score > best.score * (1.0 + ctx.keep_margin):
            return self.new_cluster(
                ctx, best, f"{best.pool.key} costs {best.score:.2f} per useful hour vs {same.score:.2f} in "
                f"{home.key}: new gang",
            )
        lost = ctx.lost_ranks()
        short = self._no_room(ctx, home, len(lost))
        if short is not None:
            return self._fallback(ctx, short)
        return RecoveryPlan(
            strategy=self.name, action="replace-lost" if lost else "restart-in-place", pool=home, scored=same,
            launch_ranks=lost, keep_instance_ids=[n.instance_id for n in survivors],
            terminate_instance_ids=ctx.release(survivors),
            reason=f"{ctx.outcome.outcome}: keep {len(survivors)} survivors in {home.key}, launch ranks {lost}",
        )

    @staticmethod
    def _no_room(ctx: RecoveryContext, home: Pool, count: int) -> str | None:
        """Why the survivors' spot pool cannot take ``count`` more nodes now (its placement score for
        them is below ``min_gang_score``), else None. A notice means the pool just shrank below what
        the gang holds: the replacements would fail there, or be the next to go."""
        if not count or home.market != "spot" or ctx.quotes_for is None:
            return None
        fit = next((q for q in ctx.quotes_for(count) if q.pool == home), None)
        if fit is None or fit.placement_score is None or fit.placement_score >= ctx.config.min_gang_score:
            return None
        return f"pool {home.key} scores {fit.placement_score:g} for {count} more nodes"

    def _fallback(self, ctx: RecoveryContext, why: str) -> RecoveryPlan:
        best = best_pool(ctx.spec, ctx.quotes, ctx.stats, ctx.now, ctx.excluded, quotas=ctx.quotas,
                         config=ctx.config)
        return self.new_cluster(ctx, best, f"{why}: new gang in {best.pool.key}")
