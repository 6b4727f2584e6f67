"""The every-minute sweep: what events alone can miss.

1. Stale heartbeats: a node of a RUNNING/CHECKPOINTING job silent for ``stale_after_s`` is LOST
   (an unannounced loss; the outcome wait is settled and recovery resumes from the last checkpoint).
2. Orphans: instances tagged for a job that does not exist or has ended, or left over from an older
   attempt, are terminated.
3. Stuck executions: a live job whose execution is no longer RUNNING (failed, timed out, aborted),
   or that sat in a passing status (PLACING, PROVISIONING, RECOVERING, CANCELLING) longer than
   ``stuck_after_s``, is marked FAILED (its execution stopped) and its instances terminated.
4. Budget (``services/budget.py``): a running job whose cost so far, the running attempt included,
   reached the spec's ``budget.max_total_cost`` has its ranks save, then its outcome wait failed
   with ``BudgetExceededError`` (``services/stop.py``); the workflow's catch-all tears it down and
   records FAILED with that reason. A live job that reached ``budget.warn_at`` of it (0.8) is
   announced once (``budget``). Every job's open spot attempt is counted at its price in effect,
   read hourly (``budget.refresh_price``): the budget's checks and ``spotrelay cost`` use it. A stop
   that waits for the ranks' save (the budget's, a cancel's with ``--save``) whose ranks did not all
   exit by its deadline is stopped now.
5. Rebalance standbys whose bounded wait ran out without a notice are released, their cost added
   (services/prewarm.py); an instance draining its emergency save after a notice, a hot spare
   standing by, or one released in its first hour after EC2's notice and left for EC2 to take (not
   billed; until ``LEFT_TO_EC2_GRACE_S`` past its reclaim) is not an orphan.
6. Half-done submissions: a SUBMITTED job, or a VALIDATED one without an execution, older than
   ``heal_after_s`` is taken on to started, rejected or failed (``services/submit.py``).
7. Leaked agent roles: a per-job agent role and instance profile whose job has ended (or does not
   exist) is deleted; teardown normally does it, this catches a teardown that failed half way.
8. Old node records: a live job's records that no reader needs any more (ended, of an attempt five
   or more behind, or carried into a newer one) are deleted, after the orphans' charges read them
   (services/node_history.py): otherwise every read of a long job's nodes grows with its age.

One job's failure (a record that keeps conflicting, an odd record, a call that fails for its region)
does not stop the sweep of the others: each job's part of each step runs on its own, a failure is
logged with the job, listed in the report (``failed``: ``"<job>: <step>: <error>"``) and counted
(``ReconcileJobErrors``, alarmed in cdk/monitoring.py), and the next sweep tries it again. Otherwise
one poison record would leave every job unswept: no stale heartbeat, budget or stuck execution seen.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from spotrelay.domain.cost import leave_to_ec2
from spotrelay.domain.models import Job, Node, NodeState
from spotrelay.domain.status import JobStatus, transition
from spotrelay.errors import NotFoundError
from spotrelay.services import budget, node_history
from spotrelay.services.controller import (
    SPARE_LIVE,
    Controller,
    attempt_nodes,
    charge_outlived_nodes,
    end_records,
    regions_of,
    unannounced_reclaim,
)
from spotrelay.services.notify import announce
from spotrelay.services.prewarm import release_expired
from spotrelay.services.stop import finish_overdue
from spotrelay.services.waits import settle

log = logging.getLogger(__name__)
LIVE = (JobStatus.VALIDATED, JobStatus.PLACING, JobStatus.PROVISIONING, JobStatus.STARTING, JobStatus.RUNNING,
        JobStatus.CHECKPOINTING, JobStatus.RECOVERING, JobStatus.CANCELLING)
LEFT_TO_EC2_GRACE_S = 300.0  # an instance left to EC2's reclaim that still runs this long after it is an orphan
_HEARTBEATING = (NodeState.READY, NodeState.RUNNING, NodeState.DOOMED)
_PASSING = (JobStatus.PLACING, JobStatus.PROVISIONING, JobStatus.RECOVERING, JobStatus.CANCELLING)


def reconcile(ctl: Controller, now: float, stale_after_s: float = 300.0, regions: list[str] | None = None,
              stuck_after_s: float = 3600.0, heal_after_s: float = 180.0,
              sweep_s: float = budget.SWEEP_S) -> dict[str, Any]:
    """One sweep; ``sweep_s`` is how often the schedule runs it (the budget stops a sweep ahead)."""
    report: dict[str, Any] = {"lost": [], "orphans": [], "stuck": [], "over_budget": [], "budget_warned": [],
                              "stopped": [], "profiles": [],
                              "standbys": [], "healed": _heal(ctl, now, heal_after_s), "failed": []}
    jobs = [job for status in LIVE for job in ctl.store.jobs_by_status(status)]
    report["jobs"] = len(jobs)

    def each(step: str, job: Job, default: Any, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` for one job's ``step``, or ``default`` when it fails (logged, reported)."""
        try:
            return fn(*args)
        except Exception as exc:  # one job's failure must not leave the others unswept
            log.exception("reconcile: a job's step failed", extra={"job_id": job.job_id, "step": step})
            report["failed"].append(f"{job.job_id}: {step}: {type(exc).__name__}")
            return default

    # (a budget's open attempt at its price in effect, read hourly)
    jobs = [each("price", job, job, budget.refresh_price, ctl, job, now) for job in jobs]
    for job in jobs:  # rebalance standbys no notice needed
        report["standbys"] += each("standbys", job, [], release_expired, ctl, job, now)
    for job in jobs:
        if job.status in (JobStatus.RUNNING, JobStatus.CHECKPOINTING):
            report["lost"] += each("stale", job, [], _stale, ctl, job, now, stale_after_s)
            if each("budget", job, False, budget.stop_if_spent, ctl, job, now, sweep_s):
                report["over_budget"].append(job.job_id)
    for job in jobs:
        if job.job_id not in report["over_budget"] and each("warn", job, False, budget.warn, ctl, job, now, sweep_s):
            report["budget_warned"].append(job.job_id)
    for job in jobs:  # a stop that waits for the ranks' save, past its deadline: stop now
        if job.stop_save_by is not None and each("stop", job, False, _finish_overdue, ctl, job, now):
            report["stopped"].append(job.job_id)
    for job in jobs:
        if job.execution_arn and each("stuck", job, False, _stuck, ctl, job, now, stuck_after_s):
            report["stuck"].append(job.job_id)
    report["orphans"] = _orphans(ctl, jobs, regions or [], now)
    report["profiles"] = _leaked_profiles(ctl, jobs)
    report["pruned"] = sum(each("prune", job, 0, node_history.prune, ctl, job, now) for job in jobs)
    if report["failed"]:
        ctl.measure("ReconcileJobErrors", len(report["failed"]))
    log.info("reconciled", extra=report)
    return report


def _finish_overdue(ctl: Controller, job: Job, now: float) -> bool:
    return finish_overdue(ctl.store, ctl.need_workflow(), job, now)


def _heal(ctl: Controller, now: float, heal_after_s: float) -> list[str]:
    if ctl.objects is None or ctl.workflow is None:
        return []
    from spotrelay.services.submit import Ports, heal_submissions

    return heal_submissions(Ports(ctl.store, ctl.objects, ctl.workflow, ctl.notifier), now, heal_after_s)


def _stale(ctl: Controller, job: Job, now: float, stale_after_s: float) -> list[str]:
    lost = []
    for node in attempt_nodes(ctl.store, job):
        seen = node.last_heartbeat or node.launched_at
        if node.state in _HEARTBEATING and seen < now - stale_after_s:
            # EC2 may have taken it and its events never came: then its first hour is not billed (as
            # interruptions.instance_state; the reclaim was at most now: the ledger's safe side)
            update = {"state": NodeState.LOST, **unannounced_reclaim(ctl, node, now)}
            changed = ctl.store.update_node(job.job_id, node.node_id, _lost(update))
            if changed is not None:
                lost.append(f"{job.job_id}/{node.node_id}")
                log.warning("stale heartbeat: node lost", extra={"job_id": job.job_id, "node_id": node.node_id,
                                                                 "silent_s": round(now - seen, 1)})
    if lost:
        settle(ctl, job.job_id, now)
    return lost


def _lost(update: dict[str, Any]) -> Callable[[Node], Node | None]:
    return lambda n: n.model_copy(update=update) if n.state in _HEARTBEATING else None


def _stuck(ctl: Controller, job: Job, now: float, stuck_after_s: float) -> bool:
    assert job.execution_arn is not None
    try:
        status = str(ctl.need_workflow().describe(job.execution_arn)["status"])
    except NotFoundError:
        status = "MISSING"
    if status == "RUNNING":
        if job.status not in _PASSING or job.updated_at >= now - stuck_after_s:
            return False
        reason = f"stuck in {job.status.value} for {now - job.updated_at:.0f}s; execution stopped"
        ctl.need_workflow().stop(job.execution_arn, reason)
    else:
        reason = f"workflow execution {status} while the job was {job.status.value}"

    def fail(cur: Job) -> Job | None:
        if cur.status.terminal:
            return None
        target = JobStatus.CANCELLED if cur.status is JobStatus.CANCELLING else JobStatus.FAILED
        return cur.model_copy(update={"status": transition(cur.status, target), "updated_at": now,
                                      "reasons": [*cur.reasons, reason], "task_tokens": {}})

    done = ctl.store.update_job(job.job_id, fail)
    if done is None:
        return False
    # the workflow's Teardown will not run: its live node records end here, before the instances go,
    # as Teardown does it (``end_records``: a lost or exited node keeps what it was)
    end_records(ctl.store, job.job_id, ctl.store.nodes_of(job.job_id))
    ctl.need_compute().terminate_job(job.job_id, regions_of(done, ctl.store.nodes_of(job.job_id)))
    announce(ctl.notifier, done.status.value.lower(), done, now)
    log.warning("stuck execution", extra={"job_id": job.job_id, "reason": reason})
    return True


def _leaked_profiles(ctl: Controller, live: list[Job]) -> list[str]:
    compute, deleted = ctl.need_compute(), []
    for job_id in compute.job_profiles(skip=frozenset(job.job_id for job in live)):
        job = ctl.store.find_job(job_id)
        if job is not None and not job.status.terminal:
            continue  # became live since the listing
        compute.delete_job_profile(job_id)
        deleted.append(job_id)
    if deleted:
        log.warning("leaked agent roles deleted", extra={"job_ids": deleted})
    return deleted


def _draining(ctl: Controller, job: Job, instance_id: str, now: float) -> bool:
    """Still finishing its emergency save after a notice, a hot spare standing by, or released and
    left to EC2's reclaim (``_left_to_ec2``)."""
    return any(n.instance_id == instance_id and (_left_to_ec2(n, now) or _saving_or_spare(n, now))
               for n in ctl.store.nodes_of(job.job_id))


def _saving_or_spare(node: Node, now: float) -> bool:
    return node.state is not NodeState.TERMINATED and (
        (node.release_after is not None and now < node.release_after) or (node.spare and node.state in SPARE_LIVE))


def _left_to_ec2(node: Node, now: float) -> bool:
    """Released in its first hour after EC2's notice and left for EC2 to take (not billed:
    controller.release_nodes), until ``LEFT_TO_EC2_GRACE_S`` past the reclaim: one still running
    then is terminated like any orphan, so a notice EC2 never acts on cannot leak an instance."""
    return (node.state is NodeState.TERMINATED and node.ec2_reclaim_at is not None
            and leave_to_ec2(node.pool.market, node.launched_at, node.ec2_reclaim_at)
            and now < node.ec2_reclaim_at + LEFT_TO_EC2_GRACE_S)


def _orphans(ctl: Controller, live: list[Job], regions: list[str], now: float) -> list[str]:
    scan = set(regions)
    for each in live:
        scan.update(regions_of(each))
    by_id = {each.job_id: each for each in live}
    doomed: dict[str, list[str]] = {}
    outlived: dict[str, set[str]] = {}  # a live job's instances of a closed attempt: charged past its close
    for inst in ctl.need_compute().list_tagged(sorted(scan)):
        job: Job | None = by_id.get(inst.job_id or "")
        if job is None and inst.job_id:
            job = ctl.store.find_job(inst.job_id)
        if job is not None and not job.status.terminal:
            if inst.attempt is None or inst.attempt >= job.attempt:
                continue  # current (or being launched)
            if any(n.instance_id == inst.instance_id for n in attempt_nodes(ctl.store, job)):
                continue  # a survivor carried into the current attempt
            if _draining(ctl, job, inst.instance_id, now):
                continue  # finishing its emergency save after a notice (recovery.launch_at_notice)
            outlived.setdefault(job.job_id, set()).add(inst.instance_id)
        doomed.setdefault(inst.pool.region, []).append(inst.instance_id)
    for region, ids in doomed.items():
        ctl.need_compute().terminate(ids, region)
        log.warning("orphans terminated", extra={"region": region, "instance_ids": ids})
    for job_id, instances in outlived.items():  # (a drained rank whose exit never released it)
        records = [n for n in ctl.store.nodes_of(job_id) if n.instance_id in instances]
        charge_outlived_nodes(ctl, job_id, end_records(ctl.store, job_id, records, keep=()), now)
    return sorted(i for ids in doomed.values() for i in ids)
