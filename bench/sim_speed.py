"""How fast the simulator runs: 1,000 job-months (100 jobs x 10 months, 32 nodes each) per policy.

    .venv/bin/python bench/sim_speed.py [--jobs 100] [--months 10] [--nodes 32] [--market g4dn|synthetic]

Prints, per market (the g4dn trace and the synthetic market; both by default), the simulated events,
the wall and CPU seconds and the events per CPU-second, for spotrelay alone (the policy that walks the
ASL and calls the shipped decisions) and with ``--all-policies`` for every policy together, both
scaled to 1,000 job-months against the 60 s target, and a last line with both markets side by side.
Wall time on a shared machine moves with its load; the target is judged on CPU seconds, the steadier
figure (``--jobs 10`` measures a tenth of the default and scales it).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from spotrelay.sim.build import MarketOptions
from spotrelay.sim.job import JobModel
from spotrelay.sim.runner import POLICIES, SimOptions, simulate

TRACE = Path(__file__).resolve().parents[1] / "spotrelay" / "local" / "data" / "bamboo-g4dn-trace.csv"
HOURS_PER_MONTH = 730.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--months", type=float, default=10.0)
    parser.add_argument("--nodes", type=int, default=32)
    parser.add_argument("--market", choices=["g4dn", "synthetic", "both"], default="both")
    parser.add_argument("--all-policies", action="store_true", help="also time every policy together")
    args = parser.parse_args()
    markets = ["g4dn", "synthetic"] if args.market == "both" else [args.market]
    job = JobModel(nodes=args.nodes, job_hours=args.months * HOURS_PER_MONTH)
    job_months = args.jobs * args.months
    side: list[str] = []
    for name in markets:
        market = (MarketOptions(traces=[str(TRACE)]) if name == "g4dn"
                  else MarketOptions(trace_format="synthetic", synthetic_days=60))
        for policies in (("spotrelay",), POLICIES) if args.all_policies else (("spotrelay",),):
            opts = SimOptions(market=market, job=job, policies=policies, jobs=args.jobs)
            wall0, cpu0 = time.perf_counter(), time.process_time()
            report = simulate(opts)
            wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
            what = "spotrelay" if len(policies) == 1 else f"all {len(policies)} policies"
            per_k = 1000.0 / (job_months * len(policies))  # seconds per 1,000 job-months (per policy)
            print(f"{name:9} {what:16} {job_months:,.0f} job-months x {len(policies)}: {report.events:>10,} events, "
                  f"{wall:6.1f} s wall, {cpu:6.1f} s CPU, {report.events / cpu:>9,.0f} events/CPU-s; "
                  f"per 1,000 job-months {wall * per_k:,.0f} s wall, {cpu * per_k:,.0f} s CPU "
                  f"({'met' if cpu * per_k <= 60 else 'NOT met'} on CPU: <= 60 s)")
            if len(policies) == 1:
                side.append(f"{name} {report.events / cpu:,.0f} events/CPU-s, {cpu * per_k:,.0f} s CPU "
                            f"({'met' if cpu * per_k <= 60 else 'NOT met'})")
    if len(side) > 1:
        print(f"side by side, spotrelay per 1,000 job-months (target 60 s CPU): {'; '.join(side)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
