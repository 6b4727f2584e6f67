"""Every (market, gang size, seed) where spotrelay is not the cheapest policy per useful GPU-hour but the
price limit (issue 11 target (c)), over more seeds than bench/economics.py runs.

    .venv/bin/python bench/seed_scan.py [--markets g4dn,bamboo,g4dn-nodes,synthetic,p3] [--nodes 8,16,32]
        [--seeds 10] [--first-seed 0] [--job-hours 72] [--trace FILE ...]

``--trace FILE`` (repeatable) scans a Bamboo-format trace of your own, as market ``STEM`` (the catalog's
prices, 300 s boot) and ``STEM/bamboo`` (Bamboo's settings), instead of the named markets unless
``--markets`` is given too; bench/trace_variants.py writes some unlike the shipped ones.

Prints each seed's cost per useful GPU-hour of every policy (USD) and flags the seeds that miss the
target with the policy that beat spotrelay; then, per market and size, the mean of spotrelay's cost over
the cheapest rival's (a change's effect reads better there than in the count of misses, which a few
price paths decide).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from bench.sim_sweep import MARKETS
from spotrelay.sim.build import MarketOptions
from spotrelay.sim.job import JobModel
from spotrelay.sim.report import cheaper, cheapest_rival
from spotrelay.sim.runner import POLICIES, SimOptions, run_seed

DEFAULT_MARKETS = "g4dn,bamboo,g4dn-nodes,synthetic,p3"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markets", default=None, help=f"default: {DEFAULT_MARKETS} (none with --trace)")
    parser.add_argument("--trace", type=Path, action="append", default=[],
                        help="a Bamboo-format trace to scan (markets STEM and STEM/bamboo)")
    parser.add_argument("--nodes", default="8,16,32")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--job-hours", type=float, default=72.0)
    parser.add_argument("--policies", default=",".join(POLICIES),
                        help="spotrelay and the rivals to run (the two baselines are slow on g4dn-nodes)")
    args = parser.parse_args()
    policies = tuple(p for p in POLICIES if p in args.policies.split(","))
    if "spotrelay" not in policies:
        print("error: --policies must include spotrelay", file=sys.stderr)
        return 2
    markets = dict(MARKETS)
    for trace in args.trace:
        if not trace.is_file():
            print(f"error: --trace {trace}: no such file", file=sys.stderr)
            return 2
        markets[trace.stem] = {"traces": [str(trace)]}
        markets[f"{trace.stem}/bamboo"] = {**MARKETS["bamboo"], "traces": [str(trace)]}
    named = args.markets or ("" if args.trace else DEFAULT_MARKETS)
    names = [n for n in named.split(",") if n] + [m for t in args.trace for m in (t.stem, f"{t.stem}/bamboo")]
    unknown = [n for n in names if n not in markets]
    if unknown:
        print(f"error: unknown market {unknown[0]!r} (known: {', '.join(markets)})", file=sys.stderr)
        return 2
    misses: list[str] = []
    ratios: dict[tuple[str, int], list[float]] = {}
    started = time.perf_counter()
    print(f"{'market':18} {'nodes':>5} {'seed':>4} " + " ".join(f"{p:>14}" for p in policies))
    for market in names:
        for nodes in [int(n) for n in args.nodes.split(",")]:
            opts = SimOptions(market=MarketOptions(**markets[market]), policies=policies,
                              job=JobModel(nodes=nodes, job_hours=args.job_hours))
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                by = {r.policy: r.values for r in run_seed(opts, seed)}
                cost = {p: v["cost_per_useful_gpu_hour"] for p, v in by.items()}
                best, best_cost = cheapest_rival(cost) or ("spotrelay", cost["spotrelay"])
                miss = cheaper(best_cost, cost["spotrelay"])  # (a tie to float rounding is none)
                if best != "spotrelay":
                    ratios.setdefault((market, nodes), []).append(cost["spotrelay"] / best_cost)
                line = (f"{market:18} {nodes:>5} {seed:>4} " + " ".join(f"{cost[p]:>14.3f}" for p in policies)
                        + (f"  MISS: {best} {best_cost / cost['spotrelay']:.3f}" if miss else "")
                        + f"  wall {by['spotrelay']['wall_hours']:.0f} h od {by['spotrelay']['on_demand_share']:.0%}")
                print(line, flush=True)
                if miss:
                    misses.append(line)
    print(f"\n{len(misses)} miss(es) in {time.perf_counter() - started:.0f} s")
    for line in misses:
        print(line)
    if ratios:
        print(f"\n{'market':18} {'nodes':>5} {'runs':>5} {'spotrelay / cheapest rival':>27} {'misses':>7} {'worst':>7}")
    for (market, nodes), got in ratios.items():
        print(f"{market:18} {nodes:>5} {len(got):>5} {statistics.fmean(got):>27.4f} "
              f"{sum(r > 1 for r in got):>7} {max(got):>7.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
