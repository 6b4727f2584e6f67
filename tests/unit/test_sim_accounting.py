"""The simulator's books balance on markets and settings nobody picked: every policy, random configs.

Each run's paid GPU-seconds are split into phases (sim/losses.py) and its training into useful, stalled
and redone work; the report's shares only read as a breakdown if the phases add up to what was paid,
useful work never exceeds what was trained, and a finished job's useful work is the job's. A phase
clamped at zero (idle, lost work) would hide a bug in the books: here the sums are checked raw.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from spotrelay.sim.build import MarketOptions, build_market
from spotrelay.sim.job import REF_TYPE, JobModel
from spotrelay.sim.runner import POLICIES, SimOptions, job_starts, make_run, measure

DATA = Path(__file__).resolve().parents[2] / "spotrelay" / "local" / "data"
TRACES = {"g4dn": DATA / "bamboo-g4dn-trace.csv", "p3": DATA / "bamboo-p3-64-trace.csv"}


def random_config(i: int) -> tuple[SimOptions, int]:
    """Config ``i``: a market (trace read as capacity or nodes, Bamboo's prices, synthetic, a thin discount),
    physics, a gang size, a job and spotrelay switches, all drawn from ``i``; and a seed."""
    r = random.Random(f"accounting/{i}")
    kind = r.choice(["g4dn", "g4dn-nodes", "bamboo", "synthetic", "p3", "thin"])
    m = MarketOptions()
    if kind == "synthetic":
        m.trace_format, m.synthetic_days = "synthetic", 10.0
    else:
        m.traces = [str(TRACES["p3" if kind == "p3" else "g4dn"])]
    if kind == "g4dn-nodes":
        m.trace_semantics = "nodes"
    if kind == "bamboo":
        m.boot_s, m.on_demand_price, m.spot_price = 45.0, 3.06, 0.91
    if kind == "thin":
        m.on_demand_price, m.spot_price = 3.06, 3.06 * r.choice([0.85, 1.0])
    m.unannounced_share = r.choice([0.0, 0.1, 1.0])
    m.rebalance_share = r.choice([0.0, 0.5, 1.0])
    if r.random() < 0.3:
        m.regions = r.sample(["us-east-1", "us-east-2", "us-west-2", "eu-west-1"], 2)
    nodes = r.choice([1, 2, 3, 4, 8, 16])
    job = JobModel(nodes=nodes, job_hours=r.choice([2.0, 6.0, 24.0]), checkpoint_minutes=r.choice([5.0, 30.0]),
                   deadline_hours=r.choice([None, None, 8.0]))
    switches: dict[str, object] = {}
    if nodes >= 4 and r.random() < 0.4:
        switches["min_nodes"] = r.randint(1, nodes)
    if r.random() < 0.3:
        switches["spares"] = 1
    if r.random() < 0.3:
        switches["launch_at_notice"] = False
    if r.random() < 0.3:
        switches["strategy"] = "replace-cluster"
    if r.random() < 0.3:
        switches["every_minutes"] = "auto"
    if r.random() < 0.2:
        switches["prewarm_on_rebalance"] = True
    return SimOptions(market=m, job=job, spotrelay_switches=switches), r.randint(0, 40)


@pytest.mark.parametrize("i", range(30))
def test_every_policys_books_balance(i: int) -> None:
    opts, seed = random_config(i)
    market = build_market(opts.market, seed)
    start = job_starts(seed, 1)[0]
    for policy in POLICIES:
        run = make_run(policy, opts, market, seed * 1000, start)
        run.start()  # type: ignore[attr-defined]
        run.loop()
        values = measure(policy, seed, run).values
        where = f"config {i} ({opts.market}, {opts.job}, {opts.spotrelay_switches}), {policy}"
        phases = dict(run.loss_gpu_s)
        stall = phases.pop("checkpoint_stall", 0.0)
        trained = phases.get("train", 0.0)
        paid, useful = run.paid_gpu_s, run.useful_gpu_hours() * 3600.0
        # boot, restore, idle, drain, never trained, spare and training: each paid second once
        assert sum(phases.values()) == pytest.approx(paid, rel=1e-9, abs=1e-6), where
        assert useful <= trained - stall + 1e-6 * max(paid, 1.0), where  # useful work was trained, past its stalls
        assert all(v >= -1e-9 for v in phases.values()), where
        assert 0.0 <= values["goodput"] <= 1.0 and 0.0 <= values["on_demand_share"] <= 1.0, where
        assert values["cost_usd"] >= 0.0 and values["steps_lost"] >= 0.0 and not values["inconsistent"], where
        if run.metrics.finished and opts.job.deadline_hours is None:  # the whole job reached the model
            work = run.total * opts.job.step_s(REF_TYPE) * opts.job.nodes * opts.job.ref_gpus()
            assert useful == pytest.approx(work, rel=1e-9), where
