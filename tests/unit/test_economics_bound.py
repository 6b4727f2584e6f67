"""bench/economics_bound.py: the idealised placers end, and room to spare is a real constraint."""

from __future__ import annotations

from bench.economics_bound import TRACE, walk
from spotrelay.sim.build import MarketOptions, build_market
from spotrelay.sim.market import TraceCapacity

WORK_S = 6 * 3600.0


def _spot_pools() -> list:
    market = build_market(MarketOptions(traces=[TRACE]), 0)
    return [sp for sp in market.pools if sp.spot and isinstance(sp.capacity, TraceCapacity)]


def test_a_gang_no_pool_holds_gives_no_bound_instead_of_waiting_forever() -> None:
    pools = _spot_pools()
    too_big = max(sp.capacity.peak for sp in pools) + 1
    for placer in ("oracle", "most-free"):
        assert walk(placer, pools, too_big, 300.0, WORK_S, 0.0, 1800.0, horizon_s=2 * 86400.0) is None


def test_headroom_waits_for_room_the_plain_placer_does_not() -> None:
    pools = _spot_pools()
    nodes = 8
    plain = walk("most-free", pools, nodes, 300.0, WORK_S, 0.0, 1800.0)
    assert plain is not None and plain[1] >= WORK_S
    assert walk("most-free+0", pools, nodes, 300.0, WORK_S, 0.0, 1800.0) == plain
    # asking for more room than any pool ever has: it never launches
    room = max(sp.capacity.peak for sp in pools) - nodes + 1
    assert walk(f"most-free+{room}", pools, nodes, 300.0, WORK_S, 0.0, 1800.0, horizon_s=86400.0) is None
