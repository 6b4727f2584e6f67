"""With launch_at_notice the replacement gang boots while the noticed gang trains on to its save.
What befalls the new gang then (a node lost or noticed while it boots) is the new attempt's: the
services' recover works on the current attempt's nodes and lets the last one's ranks drain, so their
save still lands and the next gang resumes from it. The simulator once stopped the old gang at the
loss and threw that save away (it resumed from the periodic checkpoint before the notice)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.trace_variants import _rows, scaled, write
from spotrelay.local.market import MarketModel
from spotrelay.sim.build import MarketOptions, build_market
from spotrelay.sim.controller import SpotrelayRun
from spotrelay.sim.job import REF_NODES, JobModel
from spotrelay.sim.market import from_quotes
from spotrelay.sim.records import Fault, SimNode
from spotrelay.sim.runner import SimOptions, job_starts, make_run
from spotrelay.spec.load import load_spec
from tests.unit.test_sim_calibration import TINY
from tests.unit.test_sim_pinned import TRACE as TRACE_PATH

TRACE_FILE = Path(TRACE_PATH)

STEP_S = 10.0  # checkpoints every 10 steps; the notice at step 20 of attempt 1, a 120 s window


def _run(fate: str, strategy: str = "replace-lost-nodes") -> tuple[SpotrelayRun, dict[str, Any]]:
    """The demo's 2-rank job; when attempt 2's replacement launches (at the notice), its node is lost
    without notice 5 s later (``fate`` "lost") or noticed 10 s later ("noticed"), while it boots; or
    ("restoring") it boots in 20 s and is noticed 40 s after its launch, while it restores."""
    spec = load_spec(TINY)
    res = spec.resources
    twin = MarketModel(regions=res.regions)
    quotes = twin.quotes(res.regions, res.instance_types, [m.value for m in res.markets])
    on_demand = {(r, t): twin.on_demand_price(t, r) for r in res.regions for t in res.instance_types}
    market = from_quotes(quotes, on_demand, boot_s=20.0 if fate == "restoring" else twin.boot_time_s)
    job = JobModel(nodes=res.nodes, steps=60, ref_step_s=STEP_S * res.nodes / REF_NODES,
                   checkpoint_minutes=10 * STEP_S / 60.0, notice_s=120.0, checkpoint_bytes=50e6)
    run = SpotrelayRun(market, job, seed=0, regions=res.regions, instance_types=res.instance_types, spec=spec,
                       faults=(Fault("notice", rank=1, step=20, attempt=1),), timeline=True,
                       spec_overrides={"recovery": {"strategy": strategy}})
    seen: dict[str, Any] = {}
    launch = run.launch

    def launched(sp: Any, ranks: list[int], attempt: int, **kw: Any) -> list[SimNode] | None:
        nodes = launch(sp, ranks, attempt, **kw)
        if attempt == 2 and nodes and fate == "rebalanced":
            node = nodes[0]
            run.at(run.now + 5.0, run._rebalance, node)
            run.at(run.now + 6.0, lambda _: seen.update(old_trains=run.running and node not in run.seg_nodes,
                                                        forced=list(run.forced)))
        elif attempt == 2 and nodes:
            node = nodes[0]
            node.announced = fate != "lost"
            after = {"lost": 5.0, "noticed": 130.0, "restoring": 160.0}[fate]
            run.reclaim(node, run.now + after, rebalance=False)
            probe_t = run.now + after - (1.0 if fate == "lost" else 121.0)
            run.at(probe_t, lambda _: seen.update(old_trains=run.running and node not in run.seg_nodes,
                                                  booting=node.state))
        return nodes

    run.launch = launched  # type: ignore[method-assign]
    run.start()
    run.loop()
    return run, seen


def _resumed(run: SpotrelayRun) -> list[int]:
    return [int(what.rsplit(" ", 1)[1]) for _, _, what in run.metrics.timeline if what.startswith("training from")]


@pytest.mark.parametrize(("fate", "then"), [("lost", "PENDING"), ("noticed", "PENDING"), ("restoring", "READY")])
def test_the_noticed_gangs_save_outlives_its_replacements_loss(fate: str, then: str) -> None:
    run, seen = _run(fate)
    assert seen == {"old_trains": True, "booting": then}  # the case: the old gang trains, the new comes up
    assert run.metrics.finished and run.metrics.failed_reason is None
    # the old gang trained on through the window and saved (step 30 here): attempt 3 resumes from that
    # save, past the periodic checkpoint at step 20 the old code went back to
    resumed = _resumed(run)
    assert resumed[0] == 0 and len(resumed) == 2 and resumed[1] > 20, run.metrics.timeline
    assert run.metrics.steps_lost == 0


def test_a_new_gang_dropped_while_the_last_one_saves_is_released_at_once() -> None:
    """replace-cluster: attempt 2 is a whole new gang; one of its nodes is noticed while it restores
    and the last gang still trains to its save. Its other node never trained (nothing to save): it
    is released at that recovery, not kept draining for an exit that never comes (billed to the end:
    the first version of the fix above did that, and a Bamboo-settings run paid 57% of its GPU-hours
    for gangs that never trained)."""
    run, seen = _run("restoring", strategy="replace-cluster")
    assert seen == {"old_trains": True, "booting": "READY"} and run.metrics.finished
    second = [n for n in run.launched if n.attempt == 2]
    noticed = [n for n in second if n.instance_id in run.ec2_noticed]
    assert len(second) == 2 and len(noticed) == 1
    other = next(n for n in second if n is not noticed[0])
    notice_t = noticed[0].removal_t - run.job.notice_s
    # (released by that recovery, after the ASL's GatherLosses wait for the rest of the wave)
    assert other.end_t == notice_t + run.timings.loss_settle_s and not other.trained_s
    assert _resumed(run)[-1] > 20


def _longest_drain(trace: Path, seed: int) -> float:
    """The longest a node that trained stayed billed after its last training segment, 16 nodes under
    Bamboo's settings (45 s boots: new gangs come up inside the last one's notice window)."""
    opts = SimOptions(market=MarketOptions(traces=[str(trace)], boot_s=45.0, on_demand_price=3.06, spot_price=0.91),
                      job=JobModel(nodes=16, job_hours=24), policies=("spotrelay",))
    run = make_run("spotrelay", opts, build_market(opts.market, seed), seed * 1000, 0.0)
    drains: list[float] = []
    end_node = run.end_node

    def ended(node: SimNode, state: str = "TERMINATED", by_ec2: bool = False) -> None:
        if node.end_t is None and node.trained_s > 0:
            drains.append(run.now - node.train_end)
        end_node(node, state, by_ec2)

    run.end_node = ended  # type: ignore[method-assign]
    run.start()  # type: ignore[attr-defined]
    run.loop()
    assert run.metrics.finished
    return max(drains)


@pytest.mark.parametrize("seed", range(4))
def test_no_rank_drains_long_past_its_save(seed: int, tmp_path: Path) -> None:
    """A rank left to drain (its gang dropped while it saves) is released once that save is done (its
    notice window at most), whichever attempt's number it carries: a kept survivor carries the new
    one's while it saves for the old. Released by attempt number, seed 1 here billed one for 47 h."""
    trace = tmp_path / "g4dn-x0.75.csv"
    write(trace, scaled(_rows(TRACE_FILE), 0.75))  # bench/trace_variants.py: the shipped trace, faster
    assert _longest_drain(trace, seed) <= 600.0


def test_a_rebalance_on_the_new_gangs_node_forces_no_save_of_the_last_gang() -> None:
    """While a new gang comes up the job is not RUNNING and the services ignore a rebalance
    recommendation (interruptions.rebalance): the last gang, training to its notice save, takes no
    extra checkpoint for it."""
    run, seen = _run("rebalanced")
    assert seen == {"old_trains": True, "forced": []} and run.metrics.finished


def test_survivors_waiting_for_their_replacement_do_not_start_when_the_last_gang_saves() -> None:
    """The node reading at 8 nodes, seed 0: a notice's replacement (launch at notice) is itself noticed at
    its launch; recover keeps the 7 survivors and Plan waits before launching the rank again. The noticed
    gang's save then lands: only a gang the ready wait found READY may start on it, not the survivors
    (they started short of a rank once: flagged ``inconsistent``, a gang that would hang at rendezvous)."""
    opts = SimOptions(market=MarketOptions(traces=[str(TRACE_FILE)], trace_semantics="nodes"),
                      job=JobModel(nodes=8, job_hours=72), policies=("spotrelay",))
    run = make_run("spotrelay", opts, build_market(opts.market, 0), 0, job_starts(0, 1)[0])
    run.start()  # type: ignore[attr-defined]
    run.loop()
    assert run.metrics.finished and run.short_starts == 0  # type: ignore[attr-defined]
    # the attempts that kept survivors say how many (spot_evidence.billed bills them once)
    kept = [a.kept for a in run.attempts]  # type: ignore[attr-defined]
    assert any(0 < k < 8 for k in kept) and all(0 <= k <= 8 for k in kept)
