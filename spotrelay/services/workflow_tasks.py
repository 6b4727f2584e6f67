"""The job-run workflow's Lambda tasks: provision, teardown, finalize (plan is in plan.py, recover
in recovery_flow.py). Each one is safe to run twice: a retried task finds its own earlier write.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from spotrelay.contracts.events import Directive
from spotrelay.contracts.recovery import Launched, LaunchPlan, Promotion
from spotrelay.contracts.workflow import WorkflowTimings
from spotrelay.domain.cost import charge_outlived, closed_attempt
from spotrelay.domain.models import Attempt, Job, Node, NodeState, node_id_for
from spotrelay.domain.status import JobStatus, transition
from spotrelay.errors import (
    InsufficientCapacityError,
    QuotaExceededError,
)
from spotrelay.placement import PoolEvent
from spotrelay.placement.policy import gang_key, spare_count
from spotrelay.ports.compute import Compute, Instance, LaunchRequest
from spotrelay.recovery.spares import spare_ranks_to_launch
from spotrelay.services import history
from spotrelay.services.controller import (
    ENDED,
    SPARE_LIVE,
    Controller,
    end_records,
    launch_locations,
    price_in_effect,
    regions_of,
    spare_nodes,
    spec_of,
)
from spotrelay.services.notify import announce
from spotrelay.services.plan import live
from spotrelay.services.prewarm import charge_torn_down
from spotrelay.services.review import review_seconds
from spotrelay.spec.models import JobSpec

log = logging.getLogger(__name__)


def _close_attempt(job: Job, now: float, reason: str, nodes: list[Node] | None = None,
                   price: tuple[int, float] | None = None) -> dict[str, Any]:
    """Fields that stop the clock of the current attempt and add its cost (once); ``nodes``: the
    attempt's records, whose instances EC2 noticed in their first hour are not billed; ``price``:
    ``controller.price_in_effect`` (attempt number, USD per instance-hour billed over its life), used
    when it is this attempt's (else its launch price)."""
    if not job.attempts or job.attempts[-1].ended_at is not None:
        return {}
    noticed = [(n.launched_at, n.ec2_reclaim_at) for n in nodes or () if n.ec2_reclaim_at is not None]
    current = job.attempts[-1]
    billed = price[1] if price is not None and price[0] == current.number else None
    closed = closed_attempt(current, now, reason, noticed, billed)
    return {"attempts": [*job.attempts[:-1], closed], "cost_so_far": job.cost_so_far + closed.cost}


# --- provision ---------------------------------------------------------------------------------
def provision(ctl: Controller, job_id: str, plan_result: LaunchPlan, now: float,
              timings: WorkflowTimings | None = None) -> Launched:
    """Gang-launch in the first candidate with capacity. Every failed pool is recorded (cooldown)
    and excluded for the next plan; when all fail, raise the capacity error for the workflow."""
    job = live(ctl.store.get_job(job_id))
    if job.status is JobStatus.STARTING and job.attempts and job.attempts[-1].ended_at is None:
        return _launch_result(job, timings)  # a retried task: the launch already happened
    if job.status is not JobStatus.PROVISIONING:
        job = ctl.store.save_job(job.model_copy(update={
            "status": transition(job.status, JobStatus.PROVISIONING), "updated_at": now}), job.status, job.version)
    extra = _left_spares(ctl, job, plan_result.promoted)  # a spare that left meanwhile: launch its rank
    keep = list(plan_result.keep_instance_ids)
    spec = spec_of(job)
    spare_ranks = _spare_ranks(ctl, job, spec, plan_result)
    attempt = job.attempt + 1
    failed: list[str] = []
    last_error: Exception | None = None
    compute = ctl.need_compute()
    for candidate in plan_result.candidates:
        pool = candidate.pool
        # [] is meaningful: every rank survived (restart in place)
        world, ranks = plan_result.ranks_for(candidate)
        ranks = ranks + [r for r in extra if r not in ranks]
        # spares boot with the ranks (spot pools only); nothing waits for them
        wanted = ranks + (spare_ranks if spare_count(spec, pool) else [])
        request = LaunchRequest(job_id=job_id, attempt=attempt, pool=pool, count=len(wanted), ranks=wanted,
                                gang=world, **launch_locations(job, spec))
        try:
            instances = _launch(compute, request, ranks)
        except (InsufficientCapacityError, QuotaExceededError) as exc:
            event = PoolEvent.QUOTA_EXCEEDED if isinstance(exc, QuotaExceededError) else PoolEvent.CAPACITY_FAILURE
            if event is PoolEvent.CAPACITY_FAILURE and not plan_result.keeps and world > spec.resources.smallest_gang:
                failed.append(gang_key(pool.key, world))  # a smaller gang may still fit there: no cooldown
            else:
                ctl.pool_stats.record(pool.key, event, now)
                failed.append(pool.key)
            last_error = exc
            log.info("no capacity", extra={"job_id": job_id, "pool": pool.key, "error": str(exc)})
            continue
        ctl.pool_stats.record(pool.key, PoolEvent.LAUNCHED, now)
        nodes = [Node(job_id=job_id, node_id=node_id_for(attempt, i.rank), attempt=attempt, rank=i.rank,
                      instance_id=i.instance_id, pool=pool, private_ip=i.private_ip, launched_at=now,
                      spare=i.rank in spare_ranks)
                 for i in instances]
        carried = _carry_survivors(ctl, job, keep, attempt, now, world)
        # the survivors were billed since recover closed their attempt (a backoff, Plan, this launch)
        outlived = [(n.attempt, n.launched_at) for n in ctl.store.nodes_of(job_id)
                    if n.attempt == job.attempt and n.instance_id in keep and n.state not in ENDED] if keep else []
        carried += promote_spares(ctl, job, plan_result.promoted, attempt, now, world)
        nodes += carried
        for node in nodes:
            ctl.store.put_node(node)
        spares = len(spare_nodes(ctl.store, job))  # the new ones and those still standing by
        # billing starts at launch, not at NodeReady; resumed_from_step stays unknown until the trainers
        # report what they restored (TrainingResumed): a notice's final save commits after this launch
        record = Attempt(number=attempt, pool=pool, price_per_hour=candidate.price_per_hour,
                         nodes=len([n for n in nodes if not n.spare]) + spares, spares=spares, world_size=world,
                         started_at=now, kept=len(carried), loss_interval_s=candidate.loss_interval_s)

        def started(current: Job, record: Attempt = record, outlived: list[tuple[int, float]] = outlived) -> Job:
            charged, extra = charge_outlived(current.attempts, outlived, now)
            attempts, earlier = history.kept([*charged, record], current.earlier)  # (the item's bound)
            return current.model_copy(update={
                "status": transition(current.status, JobStatus.STARTING), "attempt": attempt,
                "attempts": attempts, "earlier": earlier, "cost_so_far": current.cost_so_far + extra,
                "excluded_pools": [], "task_tokens": {}, "updated_at": now})

        launched = ctl.store.update_job(job_id, started)
        assert launched is not None
        return _launch_result(launched, timings)

    ctl.store.update_job(job_id, lambda cur: cur.model_copy(update={
        "excluded_pools": sorted(set(cur.excluded_pools) | set(failed)), "updated_at": now}))
    kind = type(last_error) if last_error is not None else InsufficientCapacityError
    raise kind(f"no capacity for {len(plan_result.launch_ranks)} nodes in {len(failed)} pools: {', '.join(failed)}")


def _launch(compute: Compute, request: LaunchRequest, ranks: list[int]) -> list[Instance]:
    """The ranks and the spares in one gang launch; when the pool cannot hold the spares too, the
    ranks alone: spares are best effort (a lost rank a spare just took must not wait for a refill
    in the pool that just lost capacity), the next provision launches them again."""
    if not request.ranks:
        return []
    try:
        return compute.launch(request)
    except InsufficientCapacityError:
        if request.ranks == ranks:
            raise
        log.info("no capacity for the spares too; launching the ranks alone",
                 extra={"job_id": request.job_id, "pool": request.pool.key})
        return compute.launch(request.model_copy(update={"count": len(ranks), "ranks": ranks})) if ranks else []


def _carry_survivors(ctl: Controller, job: Job, keep: list[str], attempt: int, now: float,
                     world: int) -> list[Node]:
    """Survivors kept by replace-lost-nodes join the new attempt: a new node record each, with a
    RESTART directive (a model the agent parses) so their agents restart training in the new gang,
    from their own local tier, and report NodeReady again."""
    if not keep:
        return []
    old = [n for n in ctl.store.nodes_of(job.job_id) if n.attempt == job.attempt and n.instance_id in keep]
    why = f"replacement nodes joined; attempt {attempt}"
    # a survivor EC2 noticed since recover chose it (one reclaim of several nodes, its notices handled one
    # by one) joins doomed: the ready wait ends at once and recovers, instead of a gang that reports
    # ready and then loses that node before it trains
    return [n.model_copy(update={
        "node_id": node_id_for(attempt, n.rank), "attempt": attempt, "version": 0,
        "state": NodeState.DOOMED if n.state is NodeState.DOOMED or n.reclaim_at is not None else NodeState.PENDING,
        "directive": Directive.restart(job.job_id, attempt, n.rank, now, why, world).model_dump(mode="json"),
        "exit_code": None}) for n in old]


def _spare_ranks(ctl: Controller, job: Job, spec: JobSpec, plan_result: LaunchPlan) -> list[int]:
    """Ranks (past the gang's) for the hot spares to launch now: ``resources.spares`` minus those
    standing by and not taking a rank in this plan."""
    return spare_ranks_to_launch(spare_nodes(ctl.store, job), [p.instance_id for p in plan_result.promoted],
                                 spec.resources.nodes, spec.resources.spares)


def _left_spares(ctl: Controller, job: Job, promoted: list[Promotion]) -> list[int]:
    """Ranks recover gave to spares that have left the bench since (reclaimed with the ranks they were
    to replace): they are launched like any lost rank, so the gang is whole when it reports ready."""
    live = {n.instance_id for n in ctl.store.nodes_of(job.job_id) if n.spare and n.state in SPARE_LIVE}
    return [p.rank for p in promoted if p.instance_id not in live]


def promote_spares(ctl: Controller, job: Job, promoted: list[Promotion], attempt: int, now: float,
                   world: int | None = None) -> list[Node]:
    """Hot spares recover chose take their ranks in the new attempt: a gang record each with a
    RESTART directive (like a survivor); their spare record ends (EXITED)."""
    records: list[Node] = []
    for take in promoted:
        spare = next((n for n in ctl.store.nodes_of(job.job_id) if n.spare and n.instance_id == take.instance_id),
                     None)
        if spare is None or spare.state not in SPARE_LIVE:
            continue  # gone meanwhile: provision launched its rank (_left_spares)
        why = f"hot spare takes rank {take.rank}; attempt {attempt}"
        records.append(spare.model_copy(update={
            "node_id": node_id_for(attempt, take.rank), "attempt": attempt, "rank": take.rank, "version": 0,
            "state": NodeState.PENDING, "spare": False, "takes_rank": None, "exit_code": None, "release_after": None,
            "directive": Directive.restart(job.job_id, attempt, take.rank, now, why, world).model_dump(mode="json")}))
        ctl.store.update_node(job.job_id, spare.node_id, lambda n: n.model_copy(update={"state": NodeState.EXITED})
                              if n.state in SPARE_LIVE else None)
    return records


def _launch_result(job: Job, timings: WorkflowTimings | None = None) -> Launched:
    last = job.attempts[-1]
    return Launched(attempt=job.attempt, pool=last.pool, price_per_hour=last.price_per_hour, nodes=last.nodes,
                    world_size=last.world_size, review_s=review_seconds(spec_of(job), timings))


# --- teardown ----------------------------------------------------------------------------------
def teardown(ctl: Controller, job_id: str, now: float) -> dict[str, Any]:
    """Terminate every instance of the job. Its live node records are marked TERMINATED first, so
    the state-change events our own termination causes are recognised as no-ops; a LOST or EXITED
    record keeps how its node ended (``end_records``, as reconcile does for a stuck execution)."""
    job = ctl.store.get_job(job_id)
    nodes = ctl.store.nodes_of(job_id)
    charge_torn_down(ctl, job_id, end_records(ctl.store, job_id, nodes), now)  # a standby standing by
    terminated = ctl.need_compute().terminate_job(job_id, regions_of(job, nodes))
    log.info("teardown", extra={"job_id": job_id, "terminated": terminated})
    return {"terminated": sorted(terminated)}


# --- finalize ----------------------------------------------------------------------------------
def error_reason(error: dict[str, Any] | None) -> str:
    """A reason line from a Step Functions Catch result ({"Error": ..., "Cause": ...})."""
    if not error:
        return "failed"
    name = str(error.get("Error", "Error"))
    cause = error.get("Cause") or ""
    try:
        parsed = json.loads(cause)
        cause = parsed.get("errorMessage", cause) if isinstance(parsed, dict) else cause
    except (TypeError, ValueError):
        pass
    return f"{name}: {cause}" if cause else name


def finalize(ctl: Controller, job_id: str, result: str, now: float,
             error: dict[str, Any] | None = None) -> dict[str, Any]:
    """Record the terminal status (SUCCEEDED, FAILED with the reason, CANCELLED) and notify once."""
    target = JobStatus(result)
    if target is JobStatus.CANCELLED:  # a stop the user did not ask for (a rank exited CANCELLED) is
        # recorded as CANCELLING first: every write moves one step along the table
        ctl.store.update_job(job_id, lambda j: None if j.status.terminal or j.status is JobStatus.CANCELLING
                             else j.model_copy(update={"status": transition(j.status, JobStatus.CANCELLING),
                                                       "updated_at": now}))

    before = ctl.store.get_job(job_id)
    price = None if before.status.terminal else price_in_effect(ctl, before, now)

    def finish(job: Job) -> Job | None:
        if job.status.terminal:
            return None  # already final: a retry or a late duplicate
        final = JobStatus.CANCELLED if job.status is JobStatus.CANCELLING else target
        update: dict[str, Any] = {"status": transition(job.status, final), "updated_at": now, "task_tokens": {}}
        update.update(_close_attempt(job, now, final.value.lower(), price=price))
        if final is JobStatus.FAILED:
            update["reasons"] = [*job.reasons, error_reason(error)]
        return job.model_copy(update=update)

    done = ctl.store.update_job(job_id, finish)
    if done is None:
        return {"status": ctl.store.get_job(job_id).status.value, "changed": False}
    ctl.measure("JobCostUSD", done.cost_so_far)
    announce(ctl.notifier, done.status.value.lower(), done, now)
    log.info("job finished", extra={"job_id": job_id, "status": done.status.value, "reasons": done.reasons})
    return {"status": done.status.value, "changed": True, "cost": round(done.cost_so_far, 4)}
