"""A reclaim wave (a pool losing every node at once) handled notice by notice: recover keeps the
survivors on the first notice, their own notices arrive before provision, and they must join the new
attempt doomed (workflow_tasks._carry_survivors; sim/recover.provision). Joined as READY, the gang
reported ready, lost those nodes before it trained, and its new node waited billed, untrained, until
its own reclaim: a day on one of Bamboo's g4dn.xlarge recordings."""

from __future__ import annotations

from pathlib import Path

from spotrelay.sim.build import MarketOptions
from spotrelay.sim.job import JobModel
from spotrelay.sim.runner import SimOptions, run_seed


def _wave_trace(path: Path) -> str:
    """A pool of 12 that loses every node at the same instant every 3 h, for 10 minutes."""
    lines, live, n, t = [], [], 0, 0
    for _ in range(4):
        while len(live) < 12:
            n += 1
            live.append(f"n{n}")
            lines.append(f"{t},add,n{n}")
        t += 3 * 3600 * 1000
        while live:
            lines.append(f"{t},remove,{live.pop()}")
        t += 10 * 60 * 1000
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_no_gang_waits_billed_for_survivors_a_wave_took(tmp_path: Path) -> None:
    market = MarketOptions(traces=[_wave_trace(tmp_path / "wave.csv")], boot_s=45.0, on_demand_price=3.06,
                           spot_price=0.91)
    opts = SimOptions(market=market, policies=("spotrelay",), job=JobModel(nodes=4, job_hours=72.0))
    never_trained = {seed: run_seed(opts, seed)[0].losses["never_trained"] for seed in range(20)}
    # with the survivors joined as READY, 5 of these seeds paid 1-2% of their GPU-hours for nodes that
    # never trained; joined doomed, the most is 0.13%
    assert max(never_trained.values()) < 0.005, never_trained
