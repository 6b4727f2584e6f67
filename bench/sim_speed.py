"""How fast the simulator runs: 1,000 job-months (100 jobs x 10 months, 32 nodes each) per policy.

    .venv/bin/python bench/sim_speed.py [--jobs 100] [--months 10] [--nodes 32,16] [--market g4dn|synthetic]
                                        [--workers 1,2]
    .venv/bin/python bench/sim_speed.py --jobs 2 --market synthetic --against main~3 [--rounds 3]
    .venv/bin/python bench/sim_speed.py --jobs 4 --market synthetic --nodes 32 --native-vs-source

Prints, per market (the g4dn trace and the synthetic market; both by default), per gang size
(``--nodes``, default 32 and 16: no g4dn pool ever holds 32 nodes, so a 32-node job runs on
on-demand there and sees a hundredth of the events a 16-node one does on spot) and per worker count
(``--workers``, default 1 and 2, timed one after the other in one run: ``simulate``'s worker
processes, spotrelay/sim/parallel.py), the simulated events, the wall and CPU seconds (the workers'
included) and the events per second, for spotrelay alone (the policy that walks the ASL and calls the
shipped decisions) and with ``--all-policies`` for every policy together, scaled to 1,000 job-months
against the 60 s target (judged on wall seconds: what a sweep waits) two ways: per 1,000 *simulated*
job-months (each job's clock from start to end) and per 1,000 job-months of *work* (what the jobs ask
for; a job that waits, boots and redoes work simulates more months than its work), with the load
average at each line, and a last line with both markets and worker counts side by side. Before and
after, the CPU seconds of a fixed pure-Python loop (the "reference loop", best of three): this shared
host's speed moves by half within an hour, so a result is read against the reference beside it.
The jobs are what the workers share out: ``--jobs`` should be a multiple of the worker count
(``--jobs 10`` measures a tenth of the default and scales it). A line whose jobs would take longer than
``--max-line-s`` (default 600 s; a probe of one job per worker says) times as many as fit and says so:
the g4dn trace at 16 nodes, a whole-gang restart every ~28 minutes, would take hours for 100 jobs.
Wall time on a shared machine moves with its load: read it with the load printed.

``--against REV``: before/after side by side in one run. The simulator of git revision REV (its
``spotrelay/`` and ``functions/``, exported to a temporary directory) and this tree's are timed in
turn, ``--rounds`` times each, alternating, every run in a fresh process; then each one's mean and
after/before. CPU seconds grow with the machine's load, so only runs alternated in one session compare.
Both run from source (``SPOTRELAY_SIM_NATIVE=0``): REV has no native build to compare.

The first line says which simulator the timed lines run: ``native`` (the mypyc build ``make install``
makes, spotrelay/sim_native.py) or ``source`` and why. ``--native-vs-source``: this tree's simulator
from source and from its native build, alternated the same way (``--rounds``, fresh processes, one
worker), with the mean CPU of each and native/source; the events must be the same.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "spotrelay" / "local" / "data" / "bamboo-g4dn-trace.csv"
HOURS_PER_MONTH = 730.0


def _measure(market_name: str, nodes: int, months: float, jobs: int, policies: tuple[str, ...],
             workers: int = 1) -> dict[str, float]:
    """One timed simulation with whichever ``spotrelay`` this process imports; CPU counts the workers."""
    from spotrelay.sim.build import MarketOptions
    from spotrelay.sim.job import JobModel
    from spotrelay.sim.runner import SimOptions, simulate

    market = (MarketOptions(traces=[str(TRACE)]) if market_name == "g4dn"
              else MarketOptions(trace_format="synthetic", synthetic_days=60))
    opts = SimOptions(market=market, job=JobModel(nodes=nodes, job_hours=months * HOURS_PER_MONTH),
                      policies=policies, jobs=jobs)
    if workers > 1:  # (an older revision timed by --against has no such field; it runs with 1)
        opts.workers = workers
    wall0, cpu0, kids0 = time.perf_counter(), time.process_time(), _children_cpu()
    report = simulate(opts)
    cpu = time.process_time() - cpu0 + _children_cpu() - kids0  # the workers are joined: counted by now
    runs = report.runs  # (every policy's, summed over the jobs)
    return {"events": report.events, "wall": time.perf_counter() - wall0, "cpu": cpu,
            # simulated job-months: each job's own clock from its start to its end (finished or not)
            "sim_months": sum(r.values["wall_hours"] for r in runs) / HOURS_PER_MONTH,
            "finished": float(all(r.finished for r in runs))}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _reference_s() -> float:
    """CPU seconds of a fixed pure-Python loop (20 million additions), best of three: how fast this
    machine runs Python right now. A shared host's speed moves by half within an hour; read a result
    against the reference printed beside it."""
    best = float("inf")
    for _ in range(3):
        t0, s = time.process_time(), 0
        for i in range(20_000_000):
            s += i
        best = min(best, time.process_time() - t0)
    return best


def _load() -> str:
    return "load average {:.1f} / {:.1f} / {:.1f} (1 / 5 / 15 min)".format(*os.getloadavg())


def _export(rev: str, into: Path) -> None:
    """REV's spotrelay/ and functions/ (the ASL the simulator walks) under ``into``."""
    blob = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", rev, "spotrelay", "functions"],
                          check=True, capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(blob)) as tar:
        tar.extractall(into, filter="data")


def _in_process(root: Path, args: argparse.Namespace, market: str, native: str = "0") -> dict[str, float]:
    """One timed run in a fresh process of ``root``'s simulator; ``native`` "1" lets it use its native build."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--market", market, "--jobs", str(args.jobs),
           "--months", str(args.months), "--nodes", str(args.nodes)]
    env = {**os.environ, "PYTHONPATH": str(root), "SPOTRELAY_SIM_NATIVE": native}
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env, cwd=root).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def _side_by_side(args: argparse.Namespace, markets: list[str], before: tuple[str, Path, str],
                  after: tuple[str, Path, str]) -> None:
    """``before`` and ``after`` (a label, a tree, its SPOTRELAY_SIM_NATIVE) timed in turn, ``--rounds``
    times each, alternating, every run in a fresh process; then each one's mean CPU and after/before."""
    job_months = args.jobs * args.months
    per_k = 1000.0 / job_months
    for market in markets:
        runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
        for r in range(args.rounds):
            for label, (what, root, native) in (("before", before), ("after", after)):
                got = _in_process(root, args, market, native)
                runs[label].append(got)
                print(f"{market:9} {args.nodes} nodes round {r + 1} {label:6} ({what}): "
                      f"{job_months:,.0f} job-months, {got['events']:,.0f} events, {got['wall']:6.1f} s wall, "
                      f"{got['cpu']:6.1f} s CPU ({got['cpu'] * per_k:,.0f} s per 1,000 job-months)", flush=True)
        mean = {k: sum(x["cpu"] for x in v) / len(v) for k, v in runs.items()}
        same = {x["events"] for v in runs.values() for x in v}
        print(f"{market:9} {args.nodes} nodes mean CPU: before {mean['before']:.2f} s "
              f"({mean['before'] * per_k:,.0f} s per 1,000 "
              f"job-months), after {mean['after']:.2f} s ({mean['after'] * per_k:,.0f} s; one process, so no "
              f"verdict: the target is the full run's wall time with its workers); after/before "
              f"{mean['after'] / mean['before']:.2f}; events {'the same' if len(same) == 1 else 'DIFFER'}")


def _against(args: argparse.Namespace, markets: list[str]) -> int:
    """REV's simulator against this tree's, both from source (REV has no native build to compare)."""
    with tempfile.TemporaryDirectory(prefix="sim_speed_") as tmp:
        _export(args.against, Path(tmp))
        _side_by_side(args, markets, (args.against, Path(tmp), "0"), ("this tree", ROOT, "0"))
    return 0


def _jobs_that_fit(args: argparse.Namespace, market: str, nodes: int, policies: tuple[str, ...],
                   workers: list[int]) -> int:
    """``--jobs``, or fewer when the line (every worker count in turn) would run past ``--max-line-s``:
    a probe of one job per worker, timed with the most workers, says how long each job takes. The
    figures per 1,000 job-months are per month simulated, so fewer jobs change the sample, not the unit
    (a stormy market's jobs all see the same kind of market: the g4dn trace at 16 nodes takes ~25x the
    time of 32 nodes, and its 100 jobs would take hours)."""
    most = max(workers)
    if args.max_line_s <= 0 or args.jobs <= most:
        return int(args.jobs)
    probe = _measure(market, nodes, args.months, most, policies, most)["wall"]
    per_job = probe / most * sum(most / n for n in workers)  # a job's share of the line's wall time
    if per_job * args.jobs <= args.max_line_s:
        return int(args.jobs)
    fit = max(most, int(args.max_line_s / per_job) // most * most)
    print(f"{market:9} {nodes:>2} nodes: {args.jobs} jobs would take ~{per_job * args.jobs:,.0f} s "
          f"(a probe of {most}: {probe:.1f} s); timing {fit} (--max-line-s {args.max_line_s:g}; 0: all)", flush=True)
    return fit


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--months", type=float, default=10.0)
    parser.add_argument("--nodes", default="32,16", help="gang sizes, each timed (default 32,16)")
    parser.add_argument("--market", choices=["g4dn", "synthetic", "both"], default="both")
    parser.add_argument("--all-policies", action="store_true", help="also time every policy together")
    parser.add_argument("--against", metavar="REV", help="also time git revision REV's simulator, alternating")
    parser.add_argument("--native-vs-source", action="store_true",
                        help="time this tree's simulator from source and from its native build, alternating")
    parser.add_argument("--rounds", type=int, default=3,
                        help="with --against or --native-vs-source: runs of each, alternated")
    parser.add_argument("--workers", default="1,2", help="worker counts to time side by side (default 1,2)")
    parser.add_argument("--max-line-s", type=float, default=600.0,
                        help="a line whose jobs would take longer (a probe of a few jobs says) runs fewer jobs, "
                             "scaled to fit; 0: always --jobs (default 600)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # one timed run, JSON out
    args = parser.parse_args()
    markets = ["g4dn", "synthetic"] if args.market == "both" else [args.market]
    sizes = [int(n) for n in str(args.nodes).split(",")]
    if args.worker:
        print(json.dumps(_measure(markets[0], sizes[0], args.months, args.jobs, ("spotrelay",))))
        return 0
    if args.against or args.native_vs_source:
        from spotrelay.sim_native import status

        if args.native_vs_source and not status()[0]:
            print(f"no native build to time: {status()[1]}")
            return 1
        for nodes in sizes:
            args.nodes = nodes
            if args.against:
                _against(args, markets)
            else:
                _side_by_side(args, markets, ("source", ROOT, "0"), ("native build", ROOT, "1"))
        return 0
    from spotrelay.sim.runner import POLICIES

    workers = sorted({int(w) for w in args.workers.split(",")})
    import spotrelay.sim
    from spotrelay.sim_native import activate

    print(f"{os.cpu_count()} CPUs; before: {_load()}; reference loop {_reference_s():.2f} s; "
          f"simulator: {activate(spotrelay.sim.__path__)[1]}", flush=True)
    side: list[str] = []
    for name, nodes in [(m, n) for m in markets for n in sizes]:
        for policies in (("spotrelay",), POLICIES) if args.all_policies else (("spotrelay",),):
            what = "spotrelay" if len(policies) == 1 else f"all {len(policies)} policies"
            jobs = _jobs_that_fit(args, name, nodes, tuple(policies), workers)
            job_months = jobs * args.months
            per_k = 1000.0 / job_months
            walls: dict[int, float] = {}
            for n in workers:
                got = _measure(name, nodes, args.months, jobs, tuple(policies), n)
                wall, cpu, events = got["wall"], got["cpu"], int(got["events"])
                # per 1,000 job-months of simulated time (jobs that wait or crawl simulate more months
                # than their work; before 2 December the jobs' retry budget ended them early, unseen)
                k = 1000.0 / got["sim_months"] if got["sim_months"] else per_k / len(policies)
                walls[n] = wall * k
                per_work = wall * per_k / len(policies)  # per 1,000 job-months of work asked for
                print(f"{name:9} {nodes:>2} nodes: {jobs} jobs of {args.months:g} months of work simulated "
                      f"{got['sim_months']:,.1f} job-months; "
                      f"{'every job finished' if got['finished'] else 'NOT every job finished (the horizon)'}")
                print(f"{name:9} {nodes:>2} nodes {what:16} {n} worker(s) {job_months:,.0f} job-months of work "
                      f"x {len(policies)}: "
                      f"{events:>10,} events, {wall:6.1f} s wall, {cpu:6.1f} s CPU, {events / wall:>9,.0f} events/s "
                      f"({events / cpu:,.0f}/CPU-s); per 1,000 simulated job-months {wall * k:,.0f} s wall "
                      f"({'met' if wall * k <= 60 else 'NOT met'}: <= 60 s), {cpu * k:,.0f} s CPU; "
                      f"per 1,000 job-months of work {per_work:,.0f} s wall "
                      f"({'met' if per_work <= 60 else 'NOT met'}); {_load()}",
                      flush=True)
            if len(policies) == 1:
                side.append(f"{name} {nodes} nodes " + ", ".join(
                    f"{n} worker(s) {walls[n]:,.0f} s ({'met' if walls[n] <= 60 else 'NOT met'})"
                    for n in workers)
                    + (f", {walls[workers[0]] / walls[workers[-1]]:.2f}x" if len(workers) > 1 else ""))
    print(f"side by side, spotrelay wall seconds per 1,000 simulated job-months (target 60 s; the lines above also "
          f"give it per 1,000 job-months of work, the jobs asked for): {'; '.join(side)}")
    print(f"after: {_load()}; reference loop {_reference_s():.2f} s")
    return 0

if __name__ == "__main__":
    sys.exit(main())
