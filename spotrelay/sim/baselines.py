"""What teams run today, modeled from their documentation (sources in docs/simulator.md). None of them
uses the notice: a reclaimed node takes the work since the last periodic checkpoint with it.

- ``on-demand``: the on-demand pool cheapest per unit of speed; never interrupted.
- ``price-limit``: the bound. The spot pool cheapest per unit of speed, no reclaims, no capacity limit.
- ``skypilot-like``: managed jobs. Any loss relaunches the whole cluster; failover goes through every
  spot pool of every region, cheapest first, the preempted region last (EAGER_NEXT_REGION); when
  none has capacity it retries after ``retry_s``. Periodic checkpoints only. No on-demand fallback.
- ``sagemaker-like``: managed spot training in one region (the first): on a reclaim the job waits
  for spot capacity in that region (polling every ``retry_s``) and resumes from the last
  checkpoint synced to S3 (the periodic one). Its own start-up overhead is not added (generous).
"""

from __future__ import annotations

import math
from typing import Any

from spotrelay.placement import catalog
from spotrelay.sim.engine import HORIZON_S, Run
from spotrelay.sim.job import JobModel
from spotrelay.sim.market import Market, SimPool
from spotrelay.sim.records import INF, Fault, SimNode

BASELINES = ("on-demand", "price-limit", "skypilot-like", "sagemaker-like")


def _throughput(sp: SimPool) -> float:
    info = catalog.instance(sp.pool.instance_type)
    return info.throughput if info else 1.0


def per_throughput(sp: SimPool, t: float) -> float:
    """USD per hour per unit of training speed: how baselines rank pools (cheapest first)."""
    info = catalog.instance(sp.pool.instance_type)
    return sp.price(t) / (info.throughput if info else 1.0) if not math.isnan(sp.price(t)) else INF


class BaselineRun(Run):
    def __init__(self, market: Market, job: JobModel, seed: int, *, policy: str, regions: list[str],
                 instance_types: list[str], retry_s: float = 120.0, start_t: float = 0.0,
                 horizon_s: float = HORIZON_S, timeline: bool = False, faults: tuple[Fault, ...] = ()) -> None:
        # (Run's arguments by name, not ``**kw``: mypyc passes a ``**kw`` on positionally, spotrelay/sim_native.py)
        super().__init__(market, job, seed, start_t, horizon_s, timeline, faults)
        self.policy, self.retry_s = policy, retry_s
        pools = [p for p in market.pools if p.pool.region in regions and p.pool.instance_type in instance_types]
        if policy == "on-demand":
            pools = [p for p in pools if not p.spot]
        elif policy == "sagemaker-like":
            pools = [p for p in pools if p.spot and p.pool.region == regions[0]]
        else:
            pools = [p for p in pools if p.spot]
        self.pools = sorted(pools, key=lambda p: (per_throughput(p, self.now), p.key))
        if not self.pools:
            raise ValueError(f"{policy}: no pool in {regions} for {instance_types}")
        self.attempt = 0
        self.ready = 0
        self.last_lost_region: str | None = None

    def start(self) -> None:
        if self.policy != "price-limit" and all(
                p.capacity is not None and p.capacity.peak < self.job.nodes for p in self.pools):
            # it would retry until the horizon: no pool it may use ever holds the gang
            self.metrics.failed_reason = f"no pool {self.policy} may use ever holds {self.job.nodes} nodes"
            return
        self.at(self.now, self._place, None)

    def bill_price(self, sp: SimPool, t: float) -> float:
        """The bound pays, at every moment, the cheapest spot price per unit of speed of any pool it may
        use (switching is free for it), scaled to the speed of the type it trains on: under prices that
        change over time, the pool cheapest at the start is not a bound (a relaunching baseline beat it)."""
        if self.policy != "price-limit":
            return sp.price(t)
        return min(per_throughput(p, t) for p in self.pools) * _throughput(sp)

    def _order(self) -> list[SimPool]:
        if self.policy in ("on-demand", "price-limit"):
            return self.pools[:1]
        pools = sorted(self.pools, key=lambda p: (per_throughput(p, self.now), p.key))
        if self.policy == "skypilot-like" and self.last_lost_region:
            pools.sort(key=lambda p: p.pool.region == self.last_lost_region)  # stable: cheapest first within
        return pools

    def _place(self, _: Any) -> None:
        self.attempt += 1
        for sp in self._order():
            nodes = self.launch(sp, list(range(self.job.nodes)), self.attempt,
                                unlimited=self.policy == "price-limit")
            if nodes is not None:
                self.gang = {n.rank: n for n in nodes}
                self.ready = 0
                return
        self.attempt -= 1
        self.at(self.now + self.retry_s, self._place, None)

    def on_booted(self, node: SimNode) -> None:
        if self.gang.get(node.rank) is not node:
            return
        self.ready += 1
        if self.ready == len(self.gang):
            self.at(self.now + self.job.restore_s(), self._train, self.epoch)

    def _train(self, epoch: int) -> None:
        if epoch != self.epoch or self.running or len(self.gang) != self.job.nodes:
            return
        sp = next(iter(self.gang.values())).pool
        self.start_training(sp.pool.instance_type, sp.gpus * len(self.gang))

    def on_removed(self, node: SimNode, announced: bool) -> None:
        if self.gang.get(node.rank) is not node:
            return
        self.metrics.interruptions += 1
        self.stop_training(self.committed(self.now))
        self.last_lost_region = node.pool.pool.region
        self.release_all()
        self.gang = {}
        self.note(node.pool.key, f"reclaim of rank {node.rank}: relaunch")
        self.at(self.now, self._place, None)

    def on_training_done(self) -> None:
        self.release_all()
        self.finish()
