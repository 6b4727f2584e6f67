"""How cheap a FIXED gang can be on the g4dn trace market, whatever the controller: an upper bound.

    .venv/bin/python bench/economics_bound.py [--nodes 16] [--seeds 5] [--job-hours 72]

It walks the simulator's own market (spotrelay/sim: the same pools, trace offsets per seed, prices,
boot and restore times) with two idealised placers for a gang of N nodes, no controller in the loop:

- ``oracle``: knows the future. At every (re)placement it takes the spot pool whose stay (until its
  capacity drops under N) costs least per trained second, and waits (unbilled) rather than take one
  that lasts under --min-life minutes. A greedy upper bound: no online placer sees this much.
- ``most-free``: what a perfect, noise-free gang-sized placement score gives an online placer: the
  spot pool with the most capacity now; it waits while none holds the gang.
- ``most-free+M`` (``--headroom M,...``): the same, but it also waits while no pool holds M nodes
  more than the gang (an online placer that asks for room to spare before it launches).

Both use only spot pools priced within 20% of the cheapest per unit of speed (waiting is unbilled,
so a dearer pool only raises the cost per useful hour).

Each placement pays the new gang from launch to the reclaim (plus its notice, during which the next
gang boots: launch at notice) and trains from boot + restore until the reclaim's save. Work lost is
none (every reclaim is announced here) and on-demand is never used, so both numbers are optimistic.
Prints cost per useful GPU-hour over on-demand's, captured saving and goodput per placer.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from spotrelay.placement import catalog
from spotrelay.sim.build import MarketOptions, build_market
from spotrelay.sim.job import JobModel
from spotrelay.sim.market import NOTICE_S, SimPool, TraceCapacity

TRACE = str(Path(__file__).resolve().parents[1] / "spotrelay" / "local" / "data" / "bamboo-g4dn-trace.csv")
STEP_S = 30.0
HORIZON_S = 400 * 86400.0  # the simulator's horizon: a job not done by then never finishes (no bound)


def unit_price(sp: SimPool) -> float:
    info = catalog.instance(sp.pool.instance_type)
    return sp.price(0.0) / (info.throughput if info else 1.0)


def life(cap: TraceCapacity, t: float, nodes: int, limit: float = 48 * 3600.0) -> float:
    """Seconds from ``t`` until the pool offers fewer than ``nodes``."""
    k = 0.0
    while k < limit and cap.capacity(t + k) >= nodes:
        k += STEP_S
    return k


def walk(placer: str, pools: list[SimPool], nodes: int, dead_s: float, work_s: float, start: float,
         min_life_s: float, horizon_s: float = HORIZON_S) -> tuple[float, float, float] | None:
    """(cost units, trained seconds, paid seconds) of one job under ``placer``; None when it does not
    finish within the horizon (no pool ever holds the gang, with its headroom, for long enough)."""
    t, cost, trained, paid = start, 0.0, 0.0, 0.0
    headroom = int(placer.partition("+")[2] or 0)  # most-free+M: launch only where M nodes more fit
    while trained < work_s:
        if t - start > horizon_s:
            return None
        now = [(sp, sp.capacity) for sp in pools if isinstance(sp.capacity, TraceCapacity)]
        fit = [(sp, cap) for sp, cap in now if cap.capacity(t) >= nodes]
        if placer == "oracle":
            scored = [(span, sp) for sp, cap in fit if (span := life(cap, t, nodes)) >= min_life_s]
            # the stay cheapest per trained second (a long stay in a dearer pool can lose to a shorter one)
            pick = min(scored, key=lambda x: unit_price(x[1]) * (x[0] + NOTICE_S) / max(1.0, x[0] + NOTICE_S - dead_s),
                       default=None)
            if pick is None:
                t += STEP_S
                continue
            span, sp = pick
        else:
            fit = [(sp, cap) for sp, cap in fit if cap.capacity(t) >= nodes + headroom]
            if not fit:
                t += STEP_S
                continue
            sp, cap = max(fit, key=lambda x: (x[1].capacity(t), -unit_price(x[0])))
            span = life(cap, t, nodes)
        billed = span + NOTICE_S  # the gang is billed until the reclaim; the next one boots in the notice
        run = max(0.0, min(work_s - trained, billed - dead_s))
        cost += billed * unit_price(sp)
        trained += run
        paid += billed
        t += max(span, STEP_S)
    return cost, trained, paid


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--job-hours", type=float, default=72.0)
    parser.add_argument("--min-life", type=float, default=30.0, help="oracle: shortest stay it takes (minutes)")
    parser.add_argument("--headroom", default="", help="also most-free+M for each M (comma list): waits for M spare")
    args = parser.parse_args()
    job = JobModel(nodes=args.nodes, job_hours=args.job_hours)
    settings = {"catalog": {"boot_s": 300.0}, "bamboo": {"boot_s": 45.0, "on_demand_price": 3.06, "spot_price": 0.91}}
    print(f"fixed gang of {args.nodes} on {Path(TRACE).name}, {args.seeds} seeds, {args.job_hours:g} h of work")
    for name, extra in settings.items():
        extra_placers = [f"most-free+{int(m)}" for m in args.headroom.split(",") if m.strip()]
        for placer in ("oracle", "most-free", *extra_placers):
            ratios, goodputs, unfinished = [], [], 0
            for seed in range(args.seeds):
                market = build_market(MarketOptions(traces=[TRACE], **extra), seed)  # type: ignore[arg-type]
                od = min(unit_price(sp) for sp in market.pools if not sp.spot)
                limit = min(unit_price(sp) for sp in market.pools if sp.spot)
                # waiting is unbilled: a bound never pays for a pool much dearer per unit of speed than the
                # cheapest spot pool (under Bamboo's flat prices that leaves p4d out: 2.8x the price per step)
                spot = [sp for sp in market.pools if sp.spot and unit_price(sp) <= 1.2 * limit]
                dead = market.boot_s + job.restore_s() - NOTICE_S  # launched at the notice
                got = walk(placer, spot, args.nodes, dead, args.job_hours * 3600.0, seed * 0.7 * 86400.0,
                           args.min_life * 60.0)
                if got is None:
                    unfinished += 1
                    continue
                cost, trained, paid = got
                ratios.append(cost / trained / od)
                goodputs.append(trained / paid)
            if unfinished:
                print(f"  {name:8} {placer:12} does not finish on {unfinished} of {args.seeds} seed(s) within "
                      f"{HORIZON_S / 86400:.0f} days: no spot pool holds the gang long enough (no bound)")
                continue
            ratio = statistics.fmean(ratios)
            print(f"  {name:8} {placer:12} vs on-demand {ratio:.3f}  ({1 / ratio:.2f}x cheaper)  captured "
                  f"{(1 - ratio) / (1 - limit / od):.3f}  goodput {statistics.fmean(goodputs):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
