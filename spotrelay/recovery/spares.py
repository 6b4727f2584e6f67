"""Hot spares (``resources.spares``): which spare takes which lost rank, and which spare ranks a
launch adds. Pure, so the workflow's services and the simulator take the same decisions.

A spare boots with the gang in its pool, holds the newest checkpoint locally and stays out of
training; when the strategy keeps survivors in that pool, a standing spare takes each lost rank
(the lowest first) instead of a launch. Spares elsewhere (or all of them, for a new gang) are
released. A provision launches new spare ranks (past the gang's) with the ranks until
``resources.spares`` stand by again.
"""

from __future__ import annotations

from collections.abc import Iterable

from spotrelay.domain.models import Node, Pool


def spare_takeovers(spares: list[Node], home: Pool | None, nodes: Iterable[Node], keep: Iterable[str],
                    size: int) -> tuple[list[tuple[Node, int]], list[Node]]:
    """(spare, rank) for every lost rank of ``0..size-1`` a standing spare in ``home`` (the survivors'
    pool; None for a new gang) takes, and the spares to release."""
    if home is None:
        return [], list(spares)
    kept = set(keep)
    alive = {n.rank for n in nodes if n.instance_id in kept}
    lost = [r for r in range(size) if r not in alive]
    here = [s for s in spares if s.pool == home]
    return list(zip(here, lost, strict=False)), [s for s in spares if s.pool != home]


def spare_ranks_to_launch(standing: list[Node], taking: Iterable[str], gang: int, wanted: int) -> list[int]:
    """Ranks (past the gang's ``0..gang-1``) for the spares to launch now: ``wanted`` minus those
    standing by and not taking a rank in this plan (``taking``: their instance ids)."""
    busy = set(taking)
    left = [n for n in standing if n.instance_id not in busy]
    used = {n.rank for n in left}
    free = (r for r in range(gang, gang + 2 * wanted + 1) if r not in used)
    return [next(free) for _ in range(max(0, wanted - len(left)))]
