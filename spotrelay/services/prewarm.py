"""Rebalance prewarm (``recovery.prewarm_on_rebalance``): a standby booted when EC2 says a node is at
elevated risk, so that if the notice follows, the rank is taken without a boot.

- ``request_standby`` (the rebalance handler): ends the outcome wait with ``Verdict.REBALANCE``
  (the rank at risk, the time the standby may wait). It launches nothing itself.
- ``prewarm`` (the workflow's Prewarm state, served by ``sfn_provision``: the one task that
  launches): one hot spare in the node's pool, ``release_after`` = that time. The workflow then
  waits for the outcome again. A notice that follows promotes it like any spare (recover).
- ``release_expired`` (reconcile): a standby whose wait ran out without a notice is released; its
  cost (the attempt's price, launch to release) goes into the ledger (``job.cost_so_far``).

A standby is billed from its launch, and in no attempt until it takes a rank: its own time is charged
to the ledger when it is released unused, when it takes a rank (recovery_flow: its time before that
attempt) or when the job is torn down while it stands by (``charge_torn_down``), and kept apart in
``job.standby_cost`` so the cost report shows where that money went.
"""

from __future__ import annotations

import logging
from typing import Any

from spotrelay.contracts.recovery import AttemptEnd, Verdict
from spotrelay.domain.cost import attempt_cost
from spotrelay.domain.models import Job, Node, node_id_for
from spotrelay.domain.status import JobStatus
from spotrelay.errors import InsufficientCapacityError, QuotaExceededError
from spotrelay.ports.compute import LaunchRequest
from spotrelay.services.controller import (
    SPARE_LIVE,
    Controller,
    attempt_nodes,
    launch_locations,
    release_nodes,
    spec_of,
    standing_by,
)
from spotrelay.services.waits import OUTCOME, deliver

log = logging.getLogger(__name__)


def _standbys(ctl: Controller, job: Job) -> list[Node]:
    return standing_by(ctl.store.nodes_of(job.job_id))


def charged(job: Job, cost: float, now: float) -> dict[str, Any]:
    """The job record's update that charges ``cost`` of standbys' time to the ledger."""
    return {"cost_so_far": job.cost_so_far + cost, "standby_cost": job.standby_cost + cost, "updated_at": now}


def request_standby(ctl: Controller, job: Job, node: Node, now: float) -> bool:
    """Ask the workflow for a standby for ``node``'s rank (one at a time per job)."""
    policy = spec_of(job).recovery
    token = job.task_tokens.get(OUTCOME)
    if not policy.prewarm_on_rebalance or not token or _standbys(ctl, job):
        return False
    ask = AttemptEnd(outcome=Verdict.REBALANCE, attempt=job.attempt, lost_ranks=(node.rank,),
                     deadline=now + policy.prewarm_wait_s, reason=f"rebalance recommendation for rank {node.rank}")
    return deliver(ctl, job.job_id, OUTCOME, token, ask, now) is not None


def prewarm(ctl: Controller, job_id: str, ask: AttemptEnd, now: float) -> dict[str, Any]:
    """Launch the standby; a capacity error or a changed job only skips it (the job goes on)."""
    job = ctl.store.get_job(job_id)
    at_risk = [n for n in attempt_nodes(ctl.store, job) if n.rank in ask.lost_ranks]
    if job.status.terminal or job.status is JobStatus.CANCELLING or job.attempt != ask.attempt or not at_risk \
            or _standbys(ctl, job):
        return {"launched": []}
    spec = spec_of(job)
    taken = {n.rank for n in ctl.store.nodes_of(job_id) if n.spare and n.state in SPARE_LIVE}
    rank = next(r for r in range(spec.resources.nodes, spec.resources.nodes + len(taken) + 1) if r not in taken)
    pool = at_risk[0].pool
    request = LaunchRequest(job_id=job_id, attempt=job.attempt, pool=pool, count=1, ranks=[rank],
                            gang=spec.resources.nodes, **launch_locations(job, spec))
    try:
        instances = ctl.need_compute().launch(request)
    except (InsufficientCapacityError, QuotaExceededError) as exc:
        log.info("no standby", extra={"job_id": job_id, "pool": pool.key, "error": str(exc)})
        return {"launched": [], "error": type(exc).__name__}
    for i in instances:
        ctl.store.put_node(Node(job_id=job_id, node_id=node_id_for(job.attempt, rank), attempt=job.attempt,
                                rank=rank, instance_id=i.instance_id, pool=pool, private_ip=i.private_ip,
                                launched_at=now, spare=True, release_after=ask.deadline))
    log.info("standby launched", extra={"job_id": job_id, "for_rank": list(ask.lost_ranks), "until": ask.deadline})
    return {"launched": [i.instance_id for i in instances], "until": ask.deadline}


def standby_cost(job: Job, node: Node, now: float) -> float:
    """What a standby cost from its launch to ``now`` at the current attempt's price."""
    price = job.attempts[-1].price_per_hour if job.attempts else 0.0
    return attempt_cost(price, 1, node.launched_at, now)


def release_expired(ctl: Controller, job: Job, now: float) -> list[str]:
    """Release the standbys whose bounded wait ran out; their cost goes into the ledger."""
    expired = [n for n in _standbys(ctl, job) if n.release_after is not None and now >= n.release_after]
    if not expired:
        return []
    cost = sum(standby_cost(job, n, now) for n in expired)
    released = release_nodes(ctl, job, expired, now)
    ctl.store.update_job(job.job_id, lambda j: j.model_copy(update=charged(j, cost, now)))
    log.info("standby released", extra={"job_id": job.job_id, "instances": released, "cost": round(cost, 4)})
    return released


def charge_torn_down(ctl: Controller, job_id: str, ended: list[Node], now: float) -> None:
    """The job's teardown ended these records (each once: ``end_records`` marked them): the standbys
    among them that still stood by are charged their time to the ledger (nothing else charges it)."""
    standbys = [n for n in ended if n.spare and n.release_after is not None and n.takes_rank is None]
    if not standbys:
        return

    def charge(cur: Job) -> Job:
        return cur.model_copy(update=charged(cur, sum(standby_cost(cur, n, now) for n in standbys), now))

    ctl.store.update_job(job_id, charge)
