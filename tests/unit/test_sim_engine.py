"""The simulator's physics: what a reclaim costs with and without notice, capacity drops, the bound."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from spotrelay.domain.models import Pool
from spotrelay.sim import engine
from spotrelay.sim.baselines import BaselineRun
from spotrelay.sim.engine import Run
from spotrelay.sim.inputs import Slot, Trace, TraceNode
from spotrelay.sim.job import JobModel
from spotrelay.sim.market import Market, SimPool, SlotCapacity, TraceCapacity
from spotrelay.sim.records import SimNode
from spotrelay.sim.runner import measure

POOL = Pool(region="us-east-1", az="us-east-1a", instance_type="p5.48xlarge", market="spot")
# 4 nodes from t=0; at 2 h two of them go (capacity 4 -> 2); back to 4 at 3 h; the trace lasts 10 h
TRACE = Trace("t", 36000.0, (TraceNode(0, 36000), TraceNode(0, 36000), TraceNode(0, 7200), TraceNode(0, 7200),
                             TraceNode(10800, 36000), TraceNode(10800, 36000)))


def market(semantics: str = "capacity") -> Market:
    sp = SimPool(pool=POOL, key=POOL.key, on_demand_price=10.0, spot_price=4.0, band=1, gpus=8,
                 capacity=TraceCapacity(TRACE, 0.0, semantics))
    return Market(pools=[sp], unannounced_share=0.0, rebalance_share=0.0, boot_s=300.0, boot_spread=0.0)


def job(nodes: int) -> JobModel:
    return JobModel(nodes=nodes, job_hours=4.0, checkpoint_minutes=30.0)


def run(policy: str, nodes: int, m: Market) -> BaselineRun:
    r = BaselineRun(m, job(nodes), 0, policy=policy, regions=["us-east-1"], instance_types=["p5.48xlarge"])
    r.start()
    r.loop()
    return r


def test_capacity_drop_reclaims_only_what_the_pool_can_no_longer_hold() -> None:
    small = run("sagemaker-like", 2, market())  # 2 of 4: the drop to 2 leaves them alone
    assert small.metrics.interruptions == 0 and small.metrics.finished
    big = run("sagemaker-like", 4, market())  # 4 of 4: the drop takes two at 2 h
    assert big.metrics.interruptions >= 1 and big.metrics.finished
    assert big.metrics.steps_lost > 0  # no notice-driven save: back to the last periodic checkpoint
    assert measure("sagemaker-like", 0, big).values["goodput"] < measure("sagemaker-like", 0, small).values["goodput"]


def test_node_semantics_lose_nodes_the_job_holds_whatever_is_left() -> None:
    nodes = TraceCapacity(TRACE, 0.0, "nodes")
    grants = nodes.grant(3600.0, 4, set(), random.Random(1))  # every live node: two of them die at 2 h
    assert grants is not None and sorted(g.removal_t for g in grants) == [7200.0, 7200.0, 36000.0, 36000.0]
    assert nodes.grant(3600.0, 5, set(), random.Random(1)) is None
    capacity = TraceCapacity(TRACE, 0.0)
    assert all(g.removal_t == float("inf") for g in capacity.grant(3600.0, 4, set(), random.Random(1)) or [])
    assert capacity.next_drop(3600.0) == 7200.0 and capacity.next_drop(7200.0 + 1) == 36000.0


def test_price_limit_is_never_interrupted_and_pays_spot() -> None:
    r = run("price-limit", 4, market())
    values = measure("price-limit", 0, r).values
    assert r.metrics.interruptions == 0 and values["steps_lost"] == 0
    hours = r.paid_gpu_s / 3600 / 8 / 4  # per node
    assert abs(values["cost_usd"] - 4 * 4.0 * hours) < 1e-6
    assert values["goodput"] > 0.95 and values["on_demand_share"] == 0


def test_checkpoint_arithmetic() -> None:
    j = job(16)
    assert j.every_steps("p5.48xlarge") == round(1800 / j.step_s("p5.48xlarge"))
    assert j.step_s("p4d.24xlarge") > 2.5 * j.step_s("p5.48xlarge")
    assert j.flush_s() < j.notice_s  # the 70B job's final save fits the notice at 16 nodes
    assert JobModel(nodes=2).flush_s() > JobModel(nodes=2).notice_s  # ... not at 2 nodes


def _slot_pool(az: str, prices: list[float]) -> SimPool:
    """A spot pool whose price changes every hour (a pools CSV's or the synthetic market's slots)."""
    pool = Pool(region="us-east-1", az=az, instance_type="p5.48xlarge", market="spot")
    slots = [Slot(start_s=3600.0 * i, spot_price=p) for i, p in enumerate(prices)]
    return SimPool(pool=pool, key=pool.key, on_demand_price=10.0, spot_price=None, band=1, gpus=8,
                   capacity=SlotCapacity(slots, 3600.0 * len(prices)))


def test_spot_bills_the_price_in_effect_not_the_launch_price() -> None:
    m = Market(pools=[_slot_pool("us-east-1a", [1.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0])], unannounced_share=0.0,
               rebalance_share=0.0, boot_s=300.0, boot_spread=0.0)
    r = run("sagemaker-like", 2, m)  # launched at 1 USD/h, runs into the 5 USD/h slots
    entries = sorted(r.entries, key=lambda e: e.started_at)
    assert {e.price_per_hour for e in entries} == {1.0, 5.0}
    expected = sum(2 * (1.0 if t < 3600.0 else 5.0) / 3600.0 for t in range(0, int(r.now)))  # per node-second
    assert abs(measure("sagemaker-like", 0, r).values["cost_usd"] - expected) < 2 * 5.0  # within 1 s of billing


def test_price_limit_is_a_bound_when_prices_move() -> None:
    # the pool cheapest at the start turns dear; another turns cheap: a baseline that relaunches into
    # the cheap one must not beat the bound
    dear_later = _slot_pool("us-east-1a", [1.0] + [6.0] * 7)
    cheap_later = _slot_pool("us-east-1b", [2.0] + [1.5] * 7)
    m = Market(pools=[dear_later, cheap_later], unannounced_share=0.0, rebalance_share=0.0, boot_s=300.0,
               boot_spread=0.0)
    bound = measure("price-limit", 0, run("price-limit", 2, m)).values
    assert bound["cost_usd"] / bound["useful_gpu_hours"] < 1.6 / 8  # at most the cheapest price per GPU


def test_a_measured_run_leaves_no_cycle_for_the_collector_and_its_threshold_is_restored() -> None:
    """run_one collects rarely while a run runs (a fifth of the CPU was the collector) and breaks the
    run's cycle (heap and walker hold its bound methods) once measured: a sweep of thousands of runs
    must not keep each until a full collection."""
    import gc

    from spotrelay.sim.build import MarketOptions, build_market
    from spotrelay.sim.runner import SimOptions, run_one

    opts = SimOptions(market=MarketOptions(trace_format="synthetic", synthetic_days=7),
                      job=JobModel(nodes=4, job_hours=48.0), policies=("spotrelay", "skypilot-like"), jobs=1)
    m = build_market(opts.market, 0)
    threshold = gc.get_threshold()
    gc.collect()
    flags = gc.get_debug()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what a collection finds goes to gc.garbage instead of being freed
    try:
        results = [run_one(opts, m, policy, 0, 0, 0.0) for policy in opts.policies]
        gc.collect()
        left = {type(o).__name__ for o in gc.garbage}
    finally:
        gc.set_debug(flags)
        gc.garbage.clear()
    assert all(r.values["useful_gpu_hours"] > 0 for r in results)
    assert not left & {"SpotrelayRun", "BaselineRun", "SimNode", "Walker"}, left
    assert gc.get_threshold() == threshold


def test_a_stormy_run_keeps_only_the_nodes_it_may_still_bill() -> None:
    """Run.launched (what bill_leftovers ends at the run's end) is pruned of ended nodes as gangs come
    and go: a 10-month stormy run launched ~100,000 nodes and held every one (400 MB) before."""
    from spotrelay.sim.build import MarketOptions, build_market
    from spotrelay.sim.controller import SpotrelayRun
    from spotrelay.sim.engine import _LAUNCHED_KEEP

    trace = str(Path(__file__).resolve().parents[2] / "spotrelay" / "local" / "data" / "bamboo-g4dn-trace.csv")
    m = build_market(MarketOptions(traces=[trace]), 0)
    r = SpotrelayRun(m, JobModel(nodes=16, job_hours=150.0), 0, regions=["us-east-1", "us-east-2", "us-west-2",
                                                                       "eu-west-1"],
                     instance_types=["p5.48xlarge", "p4d.24xlarge"])
    r.start()
    r.loop()
    created = next(r._ids)  # instance ids and grant keys: more than the nodes launched
    assert r.metrics.finished and r.metrics.recoveries > 50
    assert len(r.launched) <= 2 * _LAUNCHED_KEEP < created / 2
    assert all(n.end_t is not None for n in r.launched)  # (the leftovers were billed at the end)


def test_a_trace_time_read_back_in_floating_point_is_that_time() -> None:
    """At a removal's own time (computed as the engine computes it: launch time plus what is left of the
    node's life, with a seeded offset and many periods in), the node is gone: capacity counts it out,
    a launch never gets it with a reclaim "now" (a baseline that relaunches at once then never moved
    the clock again), and the next drop is the one after."""
    rng = random.Random(7)
    for _ in range(2000):
        offset = rng.uniform(0.0, TRACE.period_s)
        nodes, capacity = TraceCapacity(TRACE, offset, "nodes"), TraceCapacity(TRACE, offset)
        cycle = rng.randrange(1, 200)
        launched = cycle * TRACE.period_s + rng.uniform(0.0, 7000.0) - offset
        left = 7200.0 - ((launched + offset) - cycle * TRACE.period_s)
        t = launched + left  # the drop at 2 h of this period, as a grant's removal_t
        assert capacity.capacity(t) == 2 and nodes.capacity(t) == 2, (offset, cycle, t)
        got = nodes.grant(t, 2, set(), random.Random(1))
        assert got is not None and all(g.removal_t > t + 1.0 for g in got), (offset, cycle, t)
        assert capacity.next_drop(t) > t + 1.0


def test_a_run_that_answers_each_event_with_another_at_the_same_time_is_failed_not_hung(
        monkeypatch: pytest.MonkeyPatch) -> None:
    class Echo(Run):  # every event schedules the next one now: simulated time never reaches the horizon
        def tick(self, _: object) -> None:
            self.at(self.now, self.tick, None)

    monkeypatch.setattr(engine, "STUCK_EVENTS", 1000)
    r = Echo(market(), job(2), 0)
    r.at(60.0, r.tick, None)
    r.loop()
    assert r.metrics.failed_reason is not None and r.metrics.failed_reason.startswith("no progress")
    assert not r.metrics.finished and r.now == 60.0
    ok = run("sagemaker-like", 2, market())  # launches, boots and notices share times: never near the bound
    assert ok.metrics.finished and ok.metrics.failed_reason is None


def test_a_nodes_market_events_come_one_at_a_time_in_order() -> None:
    """Run.reclaim keeps a node's rebalance, notice and removal as a chain: one in the heap at a time,
    the next pushed as one fires (in time order, each with its own sequence number); a node ended
    first pushes none of the rest."""
    m = Market(pools=[SimPool(pool=POOL, key=POOL.key, on_demand_price=10.0, spot_price=4.0, band=1, gpus=8,
                              capacity=TraceCapacity(TRACE, 0.0))],
               unannounced_share=0.0, rebalance_share=1.0, boot_s=300.0, boot_spread=0.0)
    r = Run(m, job(2), 0)
    seen: list[tuple[float, str, int]] = []
    r.on_rebalance = lambda n: seen.append((r.now, "rebalance", n.rank))  # type: ignore[method-assign]
    r.on_notice = lambda n: seen.append((r.now, "notice", n.rank))  # type: ignore[method-assign]
    r.on_removed = lambda n, announced: seen.append((r.now, "removed", n.rank))  # type: ignore[method-assign]
    kept, ended = r.launch(m.pools[0], [0, 1], 1) or []
    for node in (kept, ended):
        r.reclaim(node, 7200.0)
    pending = [e for e in r._heap if e[3] is not None and not isinstance(e[3], SimNode) and e[3][0] is kept]
    assert len(pending) == 1  # the chain's next link only (the boot is its own event)
    r.end_node(ended)
    r.at(9000.0, lambda _: r.metrics.__setattr__("finished", True))
    r.loop()
    kinds = [(what, rank) for _, what, rank in seen]
    assert kinds == [("rebalance", 0), ("notice", 0), ("removed", 0)], seen  # the ended node: nothing
    assert [t for t, _, _ in seen][1:] == [7200.0 - 120.0, 7200.0]


def test_each_instance_type_boots_in_its_own_time() -> None:
    """Market.boot_by_type: a p5 node boots in its type's mean (x U(0.85, 1.15)), a p4d in the default;
    a move's deadline (expected_boot_s) reads the same."""
    p4d = Pool(region="us-east-1", az="us-east-1a", instance_type="p4d.24xlarge", market="spot")
    pools = [SimPool(pool=p, key=p.key, on_demand_price=10.0, spot_price=4.0, band=1, gpus=8,
                     capacity=TraceCapacity(TRACE, 0.0)) for p in (POOL, p4d)]
    m = Market(pools=pools, unannounced_share=0.0, rebalance_share=0.0, boot_s=300.0,
               boot_by_type={"p5.48xlarge": 420.0})
    r = Run(m, job(2), 0)
    slow, fast = r.launch(pools[0], [0, 1], 1) or [], r.launch(pools[1], [0, 1], 1) or []
    assert all(420.0 * 0.85 <= n.boot_t - n.launch_t <= 420.0 * 1.15 for n in slow)
    assert all(300.0 * 0.85 <= n.boot_t - n.launch_t <= 300.0 * 1.15 for n in fast)
    assert (m.expected_boot_s(POOL), m.expected_boot_s(p4d)) == (420.0, 300.0)
