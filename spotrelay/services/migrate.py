"""The workflow's Migrate state: a review chose a better placement (``AttemptEnd(MIGRATE)`` with its
target); move the gang make-before-break.

1. Launch the new gang first, as the next attempt, while the old one keeps training: the target
   pool at the target size (a gang that grows in its own pool launches only the new ranks).
   No capacity (or a quota): the pool cools down like any failed launch and
   ``InsufficientCapacityError`` sends the workflow back to the outcome wait; nothing else changed.
2. Then a self-imposed notice to the old attempt: every rank is told CHECKPOINT_NOW with the
   deadline = the new gang's expected ready time (``Compute.expected_boot_s`` of the target pool: by
   instance type on EC2, ``recovery/boot.py``; the modeled boot in the twin), so the ranks keep
   training and take the final save as late as their flush allows, as after a spot notice. Leaving
   ranks are DOOMED with that ``reclaim_at`` and drain (``release_after``): their exit releases them,
   and the new ranks wait for them (agent ``wait_for_drain``) before they restore from that save.
   Ranks that stay (growing in place) join the new attempt with a RESTART at the new ``world_size``.
3. The job record: the old attempt closes (its cost), the pool's observed hours are recorded, and the
   status walks RUNNING -> RECOVERING -> PLACING -> PROVISIONING -> STARTING one write at a time; no
   retry budget is spent and no pool cools down. The workflow then waits for the new gang (WaitReady).
"""

from __future__ import annotations

import logging
from typing import Any

from spotrelay.contracts.events import Directive, DirectiveKind
from spotrelay.contracts.recovery import AttemptEnd, Launched, Verdict
from spotrelay.contracts.workflow import WorkflowTimings
from spotrelay.domain.models import Attempt, Job, Node, NodeState, node_id_for
from spotrelay.domain.status import JobStatus, transition
from spotrelay.errors import InsufficientCapacityError, MoveCancelledError, QuotaExceededError
from spotrelay.placement import PoolEvent
from spotrelay.ports.compute import LaunchRequest
from spotrelay.services import history
from spotrelay.services.controller import (
    Controller,
    attempt_nodes,
    direct_nodes,
    launch_locations,
    price_in_effect,
    spec_of,
)
from spotrelay.services.recovery_flow import DRAIN_GRACE_S
from spotrelay.services.workflow_tasks import _carry_survivors, _close_attempt, _launch_result

log = logging.getLogger(__name__)
_TRAINING = (NodeState.READY, NodeState.RUNNING)
# the walk from a running attempt to a started one, one legal step per write
_WALK = (JobStatus.RECOVERING, JobStatus.PLACING, JobStatus.PROVISIONING, JobStatus.STARTING)


def _walk(ctl: Controller, job_id: str, now: float, record: Attempt, price: tuple[int, float] | None = None) -> Job:
    """``price``: the closing attempt's price in effect (``controller.price_in_effect``)."""
    for target in _WALK:
        def step(cur: Job, target: JobStatus = target) -> Job | None:
            if cur.status is target:
                return None
            update: dict[str, Any] = {"status": transition(cur.status, target), "updated_at": now}
            if target is JobStatus.RECOVERING:
                update.update(_close_attempt(cur, now, Verdict.MIGRATE.value, price=price))
                update["task_tokens"] = {}
            if target is JobStatus.STARTING:
                attempts, earlier = history.kept([*cur.attempts, record], cur.earlier)  # (the item's bound)
                update.update({"attempt": record.number, "attempts": attempts, "earlier": earlier,
                               "excluded_pools": [], "task_tokens": {}})
            return cur.model_copy(update=update)

        ctl.store.update_job(job_id, step)
    return ctl.store.get_job(job_id)


def migrate(ctl: Controller, job_id: str, move: AttemptEnd, now: float,
            timings: WorkflowTimings | None = None) -> Launched:
    job = ctl.store.get_job(job_id)
    if job.status is JobStatus.STARTING and job.attempt == move.attempt + 1:
        return _launch_result(job, timings)  # a retried task: the move already happened
    target = move.target
    old = attempt_nodes(ctl.store, job)
    if (move.outcome is not Verdict.MIGRATE or target is None or job.attempt != move.attempt
            or job.status is not JobStatus.RUNNING or any(n.state not in _TRAINING for n in old)):
        raise MoveCancelledError(f"job {job_id} is {job.status.value} on attempt {job.attempt}; not moving")
    spec = spec_of(job)
    world = target.nodes or spec.resources.nodes
    leaving = [n for n in old if n.rank in set(move.lost_ranks)]
    staying = [n for n in old if n not in leaving]
    ranks = sorted(set(range(world)) - {n.rank for n in staying})
    attempt = job.attempt + 1
    request = LaunchRequest(job_id=job_id, attempt=attempt, pool=target.pool, count=len(ranks), ranks=ranks,
                            gang=world, **launch_locations(job, spec))
    try:
        instances = ctl.need_compute().launch(request) if ranks else []
    except (InsufficientCapacityError, QuotaExceededError) as exc:
        event = PoolEvent.QUOTA_EXCEEDED if isinstance(exc, QuotaExceededError) else PoolEvent.CAPACITY_FAILURE
        ctl.pool_stats.record(target.pool.key, event, now)
        log.info("move: no capacity, staying", extra={"job_id": job_id, "pool": target.pool.key})
        raise
    ctl.pool_stats.record(target.pool.key, PoolEvent.LAUNCHED, now)
    deadline = now + ctl.need_compute().expected_boot_s(target.pool)  # the new gang's expected NodeReady
    _notice_self(ctl, job, leaving, deadline, move.reason, now)
    current = job.attempts[-1] if job.attempts else None
    if current is not None and current.pool is not None and current.started_at is not None:
        hours = max(0.0, now - current.started_at) / 3600.0 * max(1, current.nodes)
        ctl.pool_stats.record(current.pool.key, PoolEvent.OBSERVED, now, hours=hours)
    nodes = [Node(job_id=job_id, node_id=node_id_for(attempt, i.rank), attempt=attempt, rank=i.rank,
                  instance_id=i.instance_id, pool=target.pool, private_ip=i.private_ip, launched_at=now)
             for i in instances]
    carried = _carry_survivors(ctl, job, [n.instance_id for n in staying], attempt, now, world)
    nodes += carried
    for node in nodes:
        ctl.store.put_node(node)
    record = Attempt(number=attempt, pool=target.pool, price_per_hour=target.price_per_hour, nodes=len(nodes),
                     started_at=now, world_size=world, kept=len(carried),
                     loss_interval_s=target.loss_interval_s)  # resumed_from_step: the trainers report
    moved = _walk(ctl, job_id, now, record, price_in_effect(ctl, job, now))
    log.info("moved", extra={"job_id": job_id, "attempt": attempt, "pool": target.pool.key, "world": world,
                             "deadline": deadline})
    return _launch_result(moved, timings)


def _notice_self(ctl: Controller, job: Job, leaving: list[Node], deadline: float, reason: str, now: float) -> None:
    """Every rank of the old attempt saves by ``deadline``; the leaving ones are DOOMED and drain."""
    for node in leaving:
        ctl.store.update_node(job.job_id, node.node_id, lambda n: n.model_copy(update={
            "state": NodeState.DOOMED, "reclaim_at": deadline, "release_after": deadline + DRAIN_GRACE_S})
            if n.state in _TRAINING else None)
    directive = Directive(directive_id=f"move-{job.job_id}-a{job.attempt}", kind=DirectiveKind.CHECKPOINT_NOW,
                          deadline=deadline, issued_at=now, reason=reason)
    direct_nodes(ctl.store, job, directive)
