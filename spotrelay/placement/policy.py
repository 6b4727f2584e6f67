"""Placement: score every candidate pool by expected USD per useful training hour; lowest wins.

Pure: no clock, no I/O. The formula, its assumptions and a worked example are in docs/placement.md.
In short, for a gang of N nodes in a pool with price p (USD per instance-hour)::

    lambda = (interruptions + lambda_prior * H0) / (hours_observed + H0)     per instance-hour
             (+ a small hardware failure rate for every market; spot only for the rest)
    loss   = restore_hours + unannounced_share * checkpoint_interval_hours / 2
    useful = 1 / (1 + N * lambda * loss)                                      fraction of paid time
    speed  = throughput(type) * locality(region)                              vs N x p4d.24xlarge
    score  = ((N + spares) * p + N * transfer_usd + ckpt_usd) * (1 + capacity_risk) / (useful * speed)
             (with hot spares, restore_hours is the spare's takeover time, not a boot; ckpt_usd: the
             checkpoints a gang away from their region sends, per hour: checkpoint_transfer)

With ``resources.min_nodes`` < nodes, (pool, gang size) pairs are ranked: a gang of n < N nodes does
n/N of the work per hour and is charged ``(N / n) ** shrink_delay_weight`` for finishing later::

    score(n) = ((n + spares) * p + n * transfer_usd) * (1 + capacity_risk) / (useful(n) * speed * n / N) * (N / n) ** w

Nothing orders markets or types by name: spot P5 before spot P4d before on-demand is what the
numbers say for today's prices and bands, and it changes when they do.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field

from spotrelay.domain.cadence import loss_interval_s, trainer_interval_s, work_losing_share
from spotrelay.domain.models import Pool
from spotrelay.errors import NoPlacementError
from spotrelay.placement import catalog
from spotrelay.placement.gang_fit import SizedScores, quote_fits
from spotrelay.placement.pool_stats import PoolStats
from spotrelay.ports.market import PoolQuote
from spotrelay.spec.models import JobSpec

HOURS_PER_MONTH = 730.0
GANG_FIT_REASON = "placement score"  # how a pool too full for the gang is dropped (evaluate_pools' reasons)


class PlacementConfig(BaseModel):
    """Assumptions of the score. Defaults are documented in docs/placement.md."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    prior_hours: float = Field(200.0, gt=0, description="instance-hours the Spot Advisor prior weighs")
    unknown_band: int = Field(3, ge=0, le=4, description="band assumed when none is known")
    node_failure_rate: float = Field(2e-5, ge=0, description="hardware losses per instance-hour, any market")
    unannounced_share: float = Field(0.1, ge=0, le=1, description="losses that come without a notice")
    assumed_checkpoint_minutes: float = Field(30.0, gt=0, description="when the spec gives only steps")
    assumed_stall_s: float = Field(  # the stated job's is 0.8 s (docs/simulator.md); a small DDP job's far less
        5.0, ge=0, description="a periodic save's snapshot stall, for the cadence 'auto' will choose")
    default_restore_minutes: float = Field(12.0, ge=0)
    spare_takeover_minutes: float = Field(1.0, ge=0, description="a hot spare restarts a lost rank from its local tier")
    remote_data_slowdown: float = Field(0.9, gt=0, le=1, description="speed factor without a replica")
    transfer_usd_per_node_hour: float = Field(0.5, ge=0, description="cross-region reads per node-hour")
    checkpoint_transfer_usd_per_gb: float = Field(  # AWS between US regions, and from eu-west-1 to the US
        0.02, ge=0, description="a checkpoint GB sent between regions (checkpoint.size_gb and region)")
    capacity_risk_weight: float = Field(0.1, ge=0, description="score uplift at certain launch failure")
    capacity_prior_weight: float = Field(4.0, gt=0, description="launches the placement-score prior weighs")
    throughput: dict[str, float] = Field(default_factory=dict, description="overrides of catalog throughput")
    shrink_delay_weight: float = Field(  # 0.25: bench/sim_sweep.py, docs/simulator-tuning.md (0.5 before)
        0.25, ge=0, description="a smaller gang is charged (nodes / n) ** w for the time it runs longer"
    )
    min_gang_score: float = Field(
        9.0, ge=0, le=10, description="a spot pool whose placement score for the whole gang is lower cannot hold it now"
    )


DEFAULT_CONFIG = PlacementConfig()


class ScoredPool(BaseModel):
    model_config = ConfigDict(extra="forbid")
    pool: Pool
    quote: PoolQuote
    score: float  # expected USD per useful training hour of the full gang's work (lower is better)
    breakdown: dict[str, float]
    nodes: int = 0  # the gang size scored (resources.nodes unless the spec allows min_nodes)


class Ranking(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ranked: list[ScoredPool]
    dropped: dict[str, str]  # pool key -> why it is not a candidate


def band_rate(band: int) -> float:
    """Spot Advisor band -> interruptions per instance-hour (monthly frequency as a Poisson rate)."""
    monthly = catalog.BAND_MONTHLY_FREQUENCY[max(0, min(4, band))]
    return -math.log(1.0 - monthly) / HOURS_PER_MONTH


def interruption_rate(quote: PoolQuote, stats: PoolStats | None, config: PlacementConfig) -> tuple[float, float]:
    """(prior, blended) spot interruptions per instance-hour; on-demand is (0, 0)."""
    if quote.pool.market != "spot":
        return 0.0, 0.0
    band = quote.advisor_band
    if band is None:
        band = catalog.advisor_band(quote.pool.region, quote.pool.instance_type)
    prior = band_rate(config.unknown_band if band is None else band)
    seen, hours = (stats.interruptions, stats.hours_observed) if stats else (0, 0.0)
    return prior, (seen + prior * config.prior_hours) / (hours + config.prior_hours)


def capacity_risk(quote: PoolQuote, stats: PoolStats | None, config: PlacementConfig) -> float:
    """Chance a launch fails for capacity: the placement score as prior, launches seen as evidence."""
    prior = 0.5 if quote.placement_score is None else max(0.0, min(1.0, (10.0 - quote.placement_score) / 10.0))
    if quote.pool.market != "spot" and quote.placement_score is None:
        prior = 0.1  # on-demand capacity for P instances is scarce too, but less often
    fails, good = (stats.capacity_failures, stats.launches) if stats else (0, 0)
    w = config.capacity_prior_weight
    return (fails + prior * w) / (fails + good + w)


def spare_count(spec: JobSpec, pool: Pool) -> int:
    """Hot spares a gang in ``pool`` boots: spot pools only (on-demand is not reclaimed; a spare there
    would only bill, for the rare hardware failure the node failure rate covers)."""
    return spec.resources.spares if pool.market == "spot" else 0


def delay_weight(spec: JobSpec, config: PlacementConfig) -> float:
    """The exponent of a smaller gang's delay charge: what the spec states (``resources.wall_time_weight``),
    else the placement default."""
    stated = spec.resources.wall_time_weight
    return config.shrink_delay_weight if stated is None else stated


def checkpoint_hours(spec: JobSpec, config: PlacementConfig, gang_rate: float) -> float:
    """The periodic interval the gang will keep: the spec's, or with ``every_minutes: auto`` the one the
    trainers will choose at this pool's rate (with the assumed stall; they measure their own)."""
    ckpt = spec.checkpoint
    if ckpt.auto:
        # the trainers' rule, with no upload measured yet: the floor is the spec's minimum
        return trainer_interval_s(config.assumed_stall_s, 0.0, loss_interval_s(gang_rate, config.unannounced_share),
                                  ckpt.auto_min_minutes * 60.0, ckpt.auto_max_minutes * 60.0) / 3600.0
    return (ckpt.fixed_minutes or config.assumed_checkpoint_minutes) / 60.0


def _away_gb(spec: JobSpec, pool: Pool) -> float:
    """GB of the whole checkpoint a gang in ``pool`` would send across regions per save or restore: the
    spec's ``checkpoint.size_gb`` when its ``checkpoint.region`` is another; 0 beside it or unstated."""
    ckpt = spec.checkpoint
    if ckpt.size_gb is None or ckpt.region is None or pool.region == ckpt.region:
        return 0.0
    return ckpt.size_gb


def checkpoint_transfer(spec: JobSpec, pool: Pool, gang_rate: float, interval_h: float,
                        config: PlacementConfig) -> float:
    """USD per hour a gang in ``pool`` pays to send its checkpoints to another region: every periodic
    save whole, and after each of the gang's losses (``gang_rate`` per hour) the whole checkpoint read
    back (a reclaim wave or a new gang restores every rank; one lost rank only its shard: the pessimistic
    side, as restore_minutes are). Weighed only when the spec states the checkpoint's size and region
    (``checkpoint.size_gb``, ``checkpoint.region``)."""
    away = _away_gb(spec, pool)
    if away == 0.0 or interval_h <= 0:
        return 0.0
    return away * config.checkpoint_transfer_usd_per_gb * (1.0 / interval_h + gang_rate)


def checkpoint_restore_usd(spec: JobSpec, pool: Pool, share: float, config: PlacementConfig) -> float:
    """USD to read ``share`` of a stated checkpoint into ``pool`` from another region (a move's restore:
    the new ranks' shards); 0 beside it or unstated."""
    return _away_gb(spec, pool) * share * config.checkpoint_transfer_usd_per_gb


def checkpoint_home(spec: JobSpec, home_region: str, jobs_bucket: str, learned_bytes: int | None = None) -> JobSpec:
    """``spec`` with what the deployment knows of its checkpoints, where the spec leaves it out, so the
    distance is weighed without a team stating it: ``checkpoint.size_gb`` from ``learned_bytes`` (the
    newest checkpoint's size its ranks reported: ``Job.checkpoint_bytes``), and ``checkpoint.region`` for
    the jobs bucket (the default ``s3_prefix``, or one naming it, as a resumed job's does): the home
    region. A data bucket's region is left to the spec. No size known: the spec as written."""
    ckpt = spec.checkpoint
    size = ckpt.size_gb if ckpt.size_gb is not None else (learned_bytes / 1e9 if learned_bytes else None)
    if size is None:
        return spec
    bucket = ckpt.s3_prefix.removeprefix("s3://").split("/", 1)[0] if ckpt.s3_prefix else jobs_bucket
    region = ckpt.region or (home_region if bucket == jobs_bucket else None) or None
    if (size, region) == (ckpt.size_gb, ckpt.region):
        return spec
    return spec.model_copy(update={"checkpoint": ckpt.model_copy(update={"size_gb": size, "region": region})})


def loss_interval(scored: ScoredPool, config: PlacementConfig = DEFAULT_CONFIG, at_risk: float = 0.0) -> float | None:
    """Mean seconds between the scored gang's losses without a usable notice (the attempt record's
    ``loss_interval_s``: what the trainers' auto cadence reads). ``at_risk``: the share of the job's
    recent notices its ranks could not save in (``advice.notice_risk_share``): those reclaims lose work too."""
    return loss_interval_s(scored.breakdown["gang_interruptions_per_hour"],
                           work_losing_share(config.unannounced_share, at_risk))


def score_pool(
    spec: JobSpec, quote: PoolQuote, stats: PoolStats | None, config: PlacementConfig = DEFAULT_CONFIG,
    nodes: int | None = None, staying: bool = False,
) -> ScoredPool:
    """Score one pool for a gang of ``nodes`` (default: the spec's; no filtering). ``staying``: the gang
    runs there already (a review's current placement): no launch, so no risk of one failing."""
    pool, n, full = quote.pool, nodes or spec.resources.nodes, spec.resources.nodes
    spares = spare_count(spec, pool)
    info = catalog.instance(pool.instance_type)
    throughput = config.throughput.get(pool.instance_type) or (info.throughput if info else 1.0)
    restore_h = (info.restore_minutes if info else config.default_restore_minutes) / 60.0
    if spares:  # a hot spare takes the lost rank from its local tier: no boot, no download
        restore_h = config.spare_takeover_minutes / 60.0
    prior, spot_rate = interruption_rate(quote, stats, config)
    rate = spot_rate + config.node_failure_rate
    gang_rate = n * rate
    # announced losses keep the work (emergency checkpoint); unannounced ones lose half an interval
    interval_h = checkpoint_hours(spec, config, gang_rate)
    loss_h = restore_h + config.unannounced_share * interval_h / 2.0
    useful = 1.0 / (1.0 + gang_rate * loss_h)
    remote = (
        spec.dataset is not None and bool(spec.dataset.replicas) and pool.region not in spec.dataset.replicas
    )
    locality = config.remote_data_slowdown if remote else 1.0
    transfer = n * config.transfer_usd_per_node_hour if remote else 0.0
    ckpt_transfer = checkpoint_transfer(spec, pool, gang_rate, interval_h, config)
    transfer += ckpt_transfer
    # a running gang's own pool quotes a score for launching another gang there, lower by what it holds
    risk = 0.0 if staying else capacity_risk(quote, stats, config)
    gang_price = (n + spares) * quote.price_per_hour  # spares are billed like the ranks
    share = n / full  # of the full gang's work per hour
    delay = (full / n) ** delay_weight(spec, config)
    score = (gang_price + transfer) * (1.0 + config.capacity_risk_weight * risk) / (
        useful * throughput * locality * share
    ) * delay
    breakdown = {
        "price_per_hour": quote.price_per_hour,
        "gang_price_per_hour": gang_price,
        "prior_rate": prior,
        "interruption_rate": rate,
        "gang_interruptions_per_hour": gang_rate,
        "loss_hours_per_interruption": loss_h,
        "useful_fraction": useful,
        "throughput": throughput,
        "locality": locality,
        "transfer_usd_per_hour": transfer,
        "checkpoint_transfer_usd_per_hour": ckpt_transfer,
        "capacity_risk": risk,
        "spares": float(spares),
        "gang_share": share,
        "delay_factor": delay,
    }
    return _scored(pool, quote, score, breakdown, n)


_SCORED_FIELDS = frozenset(ScoredPool.model_fields)


def _scored(pool: Pool, quote: PoolQuote, score: float, breakdown: dict[str, float], nodes: int) -> ScoredPool:
    """``ScoredPool(pool=..., ...)`` without validating it again: score_pool's values are typed by
    construction (a validated Pool and quote, floats, an int). Every placement scores each pool at each
    gang size, thousands of times a simulated job-month; validating was two fifths of a score."""
    scored = ScoredPool.__new__(ScoredPool)
    object.__setattr__(scored, "__dict__", {"pool": pool, "quote": quote, "score": score, "breakdown": breakdown,
                                            "nodes": nodes})
    object.__setattr__(scored, "__pydantic_fields_set__", set(_SCORED_FIELDS))
    object.__setattr__(scored, "__pydantic_extra__", None)
    object.__setattr__(scored, "__pydantic_private__", None)
    return scored


def gang_key(pool_key: str, nodes: int) -> str:
    """An ``excluded`` entry for one pool at ``nodes`` and larger (a gang that did not fit there)."""
    return f"{pool_key}@{nodes}"


def _excluded(pool_key: str, nodes: int, excluded: frozenset[str]) -> bool:
    if pool_key in excluded:
        return True
    smallest = _gang_exclusions(excluded).get(pool_key)
    return smallest is not None and nodes >= smallest


@functools.lru_cache(maxsize=64)
def _gang_exclusions(excluded: frozenset[str]) -> dict[str, int]:
    """Pool key -> the smallest gang size excluded there (``pool@n`` entries): made once per set, not
    once per (pool, size) placement judges (a set is judged for every pool at every size). Read only."""
    out: dict[str, int] = {}
    for k in excluded:
        pool_key, at, size = k.rpartition("@")
        if at:
            out[pool_key] = min(int(size), out.get(pool_key, int(size)))
    return out


def _why_not(
    spec: JobSpec, quote: PoolQuote, stats: PoolStats | None, now: float, excluded: frozenset[str],
    quotas: Mapping[str, float] | None, running: frozenset[str] = frozenset(), nodes: int | None = None,
    config: PlacementConfig = DEFAULT_CONFIG, sized: SizedScores | None = None,
) -> str | None:
    res, pool = spec.resources, quote.pool
    nodes = nodes or res.nodes
    if _excluded(pool.key, nodes, excluded):
        return "excluded"
    if pool.instance_type not in res.instance_types:
        return "instance type not allowed by the spec"
    if pool.market not in res.markets:  # (StrEnum members equal their values)
        return "market not allowed by the spec"
    if pool.region not in res.regions:
        return "region not allowed by the spec"
    if res.max_hourly_price is not None and quote.price_per_hour > res.max_hourly_price:
        return f"price {quote.price_per_hour:.2f} above max_hourly_price {res.max_hourly_price:.2f}"
    # the quotes' scores are asked for the whole gang (MarketData.quotes' capacity), ``sized`` for
    # smaller elastic sizes: a low one says a launch fails now, or lands where the next capacity dip
    # reclaims it (placement/gang_fit.py)
    if pool.market == "spot" and pool.key not in running and quote_fits(
            quote.placement_score, res.nodes, sized, pool.key, nodes, config.min_gang_score) is False:
        return f"{GANG_FIT_REASON} for {nodes} nodes is below {config.min_gang_score:g}"
    if stats is not None and stats.cooling(now) and pool.key not in running:
        return f"cooling down until {stats.cooldown_until:.0f} after {stats.last_event}"
    info = catalog.instance(pool.instance_type)
    quota = quotas.get(f"{pool.region}/{pool.market}") if quotas else None
    if quota is not None and info is not None and nodes * info.vcpus > quota:
        return f"needs {nodes * info.vcpus} vCPUs, quota leaves {quota:.0f}"
    return None


def evaluate_pools(
    spec: JobSpec, quotes: list[PoolQuote], stats: Mapping[str, PoolStats], now: float,
    excluded: frozenset[str] = frozenset(), *, quotas: Mapping[str, float] | None = None,
    config: PlacementConfig = DEFAULT_CONFIG, running: frozenset[str] = frozenset(), gang_sizes: bool = False,
    sized: SizedScores | None = None,
) -> Ranking:
    """Candidates best first, and why each other quoted pool was dropped. ``running``: pools where
    the job's survivors run; a cooldown governs new gangs and does not drop them (their interruption
    history still weighs in the score). With ``gang_sizes``, (pool, gang size) pairs from ``nodes``
    down to ``min_nodes`` (``dropped``: pools with no size left)."""
    ranked: list[ScoredPool] = []
    dropped: dict[str, str] = {}
    passed: set[str] = set()  # pools with a size ranked (a set: a scan of ``ranked`` per pool was quadratic)
    smallest = spec.resources.smallest_gang if gang_sizes else spec.resources.nodes
    for quote in quotes:
        key, pool_stats, first_reason = quote.pool.key, stats.get(quote.pool.key), None
        for n in range(spec.resources.nodes, smallest - 1, -1):
            reason = _why_not(spec, quote, pool_stats, now, excluded, quotas, running, n, config, sized)
            if reason is None:
                ranked.append(score_pool(spec, quote, pool_stats, config, nodes=n))
                passed.add(key)
            first_reason = first_reason or reason
        if first_reason is not None and key not in passed:
            dropped[key] = first_reason
    ranked.sort(key=lambda s: (s.score, -s.nodes, s.pool.key))
    return Ranking(ranked=ranked, dropped=dropped)


def rank_pools(
    spec: JobSpec, quotes: list[PoolQuote], stats: dict[str, PoolStats], now: float,
    excluded: frozenset[str] = frozenset(), *, quotas: Mapping[str, float] | None = None,
    config: PlacementConfig = DEFAULT_CONFIG, gang_sizes: bool = False, sized: SizedScores | None = None,
) -> list[ScoredPool]:
    """Candidate pools best first (lowest expected USD per useful hour). ``quotas`` maps
    ``"<region>/<market>"`` to the vCPUs the account can still start there; ``gang_sizes`` ranks
    (pool, gang size) pairs down to ``resources.min_nodes``."""
    return evaluate_pools(spec, quotes, stats, now, excluded, quotas=quotas, config=config,
                          gang_sizes=gang_sizes, sized=sized).ranked  # fmt: skip


def best_pool(
    spec: JobSpec, quotes: list[PoolQuote], stats: dict[str, PoolStats], now: float,
    excluded: frozenset[str] = frozenset(), *, quotas: Mapping[str, float] | None = None,
    config: PlacementConfig = DEFAULT_CONFIG,
) -> ScoredPool:
    """The winner, or ``NoPlacementError`` saying why every quoted pool was dropped."""
    ranking = evaluate_pools(spec, quotes, stats, now, excluded, quotas=quotas, config=config)
    if ranking.ranked:
        return ranking.ranked[0]
    if not ranking.dropped:
        raise NoPlacementError("no pool was quoted for the spec's regions, types and markets")
    reasons = "; ".join(f"{key}: {why}" for key, why in sorted(ranking.dropped.items()))
    raise NoPlacementError(f"no candidate pool left: {reasons}")
