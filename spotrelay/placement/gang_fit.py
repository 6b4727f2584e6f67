"""Gang fit: can a spot pool hold a gang of n nodes now? Pure.

``GetSpotPlacementScores`` answers for a target capacity: the score (1-10) of launching that many
instances in each AZ now. The MarketData port asks it for the whole gang (``quotes(capacity=...)``);
for an elastic gang (``resources.min_nodes`` < nodes) Plan also asks for a few smaller sizes
(``probe_sizes``), so each (pool, size) pair is judged by a score asked for that size or a larger
one. A pool whose score for a size is below ``PlacementConfig.min_gang_score`` cannot hold it now: a
launch fails, or lands where the next capacity dip reclaims it (docs/placement.md, "Gang fit").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from spotrelay.ports.market import PoolQuote
from spotrelay.spec.models import JobSpec

# probed size -> pool key -> the placement score asked for that size (None: no score)
SizedScores = Mapping[int, Mapping[str, float | None]]
MAX_PROBES = 4  # sizes asked besides the full gang (one GetSpotPlacementScores call per region each)


def probe_sizes(spec: JobSpec) -> list[int]:
    """Smaller gang sizes to ask placement scores for: up to ``MAX_PROBES`` from just under the full
    gang down to ``min_nodes``, evenly spread (none for a fixed gang)."""
    full, least = spec.resources.nodes, spec.resources.smallest_gang
    if least >= full:
        return []
    span = full - least
    steps = min(MAX_PROBES, span)
    return sorted({full - round(span * (i + 1) / steps) for i in range(steps)}, reverse=True)


def scores_of(quotes: Iterable[PoolQuote]) -> dict[str, float | None]:
    return {q.pool.key: q.placement_score for q in quotes}


def fits(sized: SizedScores, pool_key: str, nodes: int, threshold: float) -> bool | None:
    """True when a score asked for ``nodes`` or more says the pool holds them (a gang placed under a
    size the pool was scored for keeps that much slack); None when the pool has no score at all
    (nothing to judge by); else False."""
    scored = [(m, s) for m, by in sized.items() if (s := by.get(pool_key)) is not None]
    if not scored:
        return None
    return any(m >= nodes and s >= threshold for m, s in scored)


def quote_fits(score: float | None, full: int, sized: SizedScores | None, pool_key: str, nodes: int,
               threshold: float) -> bool | None:
    """``fits`` over a quote's ``score`` (asked for the ``full`` gang) and ``sized``'s; without sized
    scores, from the quote's alone (the same answer without building the mapping: placement asks this
    for every spot pool at every gang size)."""
    if not sized:
        return None if score is None else nodes <= full and score >= threshold
    return fits({full: {pool_key: score}, **sized}, pool_key, nodes, threshold)
