"""What the controller's services work with: the ports, bundled, plus small shared look-ups."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from spotrelay.contracts.events import Directive
from spotrelay.domain.cost import charge_outlived, leave_to_ec2, mean_price, open_spot
from spotrelay.domain.models import Job, Node, NodeState
from spotrelay.ports.compute import Compute
from spotrelay.ports.job_store import JobStore
from spotrelay.ports.market import MarketData
from spotrelay.ports.metrics import METRICS, MetricsSink
from spotrelay.ports.notifier import Notifier
from spotrelay.ports.object_store import ObjectStore
from spotrelay.ports.workflow import Workflow
from spotrelay.settings import settings
from spotrelay.spec.checks import dataset_uris
from spotrelay.spec.models import JobSpec

log = logging.getLogger(__name__)


@dataclass
class Controller:
    """Ports the services need. Handlers build one from ``functions/_runtime.py``; tests and the
    twin pass their own adapters. Unused ports may be ``None`` for a service that does not touch them."""

    store: JobStore
    workflow: Workflow | None = None
    compute: Compute | None = None
    market: MarketData | None = None
    pool_stats: Any = None  # spotrelay.placement.PoolStatsStore
    notifier: Notifier | None = None
    objects: ObjectStore | None = None  # the jobs bucket (reconcile finishes stuck submissions)
    metrics: MetricsSink | None = None  # operator metrics (spotrelay/ports/metrics.py)

    def measure(self, name: str, value: float) -> None:
        """Publish one operator metric; never raises (a metric must not break the job)."""
        if self.metrics is None:
            return
        try:
            self.metrics.put(name, value, METRICS.get(name, "Count"))
        except Exception:
            log.exception("metric not published", extra={"metric": name})

    def need_workflow(self) -> Workflow:
        assert self.workflow is not None, "this service needs the workflow port"
        return self.workflow

    def need_compute(self) -> Compute:
        assert self.compute is not None, "this service needs the compute port"
        return self.compute


def spec_of(job: Job) -> JobSpec:
    """The job's spec as placement reads it: with its checkpoints' size (the spec's, else what its ranks
    reported) and region (the spec's, else the home region for the jobs bucket), so the distance to
    them is weighed (placement/policy.checkpoint_home)."""
    from spotrelay.placement.policy import checkpoint_home  # (placement's import: only the handlers that read it)

    s = settings()
    return checkpoint_home(JobSpec.model_validate(job.spec), s.region, s.bucket, job.checkpoint_bytes)


def launch_locations(job: Job, spec: JobSpec) -> dict[str, Any]:
    """A ``LaunchRequest``'s S3 places: the spec object the agent reads, the durable tier its
    checkpoints go to when the spec names one, and the dataset the training reads (the node's role is
    granted exactly those)."""
    return {"config_uri": f"s3://{settings().bucket}/{job.submission_key}",
            "checkpoint_prefix": spec.checkpoint.s3_prefix or "", "dataset_uris": dataset_uris(spec)}


def regions_of(job: Job, nodes: list[Node] | None = None) -> list[str]:
    """Every region the job may have instances in: the spec's and any node's."""
    regions = list(job.spec.get("resources", {}).get("regions", []))
    for node in nodes or []:
        if node.pool.region not in regions:
            regions.append(node.pool.region)
    return regions


def current_node(store: JobStore, instance_id: str) -> tuple[Job, Node] | None:
    """The node record of ``instance_id`` in its job's current attempt (a survivor kept by
    replace-lost-nodes has one record per attempt), with its job; None if it is not ours."""
    found = store.node_by_instance(instance_id)
    if found is None:
        return None
    job = store.find_job(found.job_id)
    if job is None:
        return None
    mine = [n for n in store.nodes_of(job.job_id) if n.instance_id == instance_id]
    return job, max(mine or [found], key=lambda n: n.attempt)


def attempt_nodes(store: JobStore, job: Job) -> list[Node]:
    """The gang of the current attempt (hot spares are not in it)."""
    return [n for n in store.nodes_of(job.job_id) if n.attempt == job.attempt and not n.spare]


def direct_nodes(store: JobStore, job: Job, directive: Directive) -> int:
    """Give every live rank of the current attempt ``directive`` (the agents poll their node item);
    how many took it (a node that has it already, exited or is gone is skipped)."""
    sent = 0
    body = directive.model_dump(mode="json")
    gone = (NodeState.LOST, NodeState.TERMINATED)
    for node in attempt_nodes(store, job):
        if node.state in gone or node.state is NodeState.EXITED:
            continue
        changed = store.update_node(job.job_id, node.node_id, lambda n: n.model_copy(
            update={"directive": body}) if (n.directive or {}).get("directive_id") != directive.directive_id
            and n.state not in gone else None)
        sent += changed is not None
    return sent


def spare_nodes(store: JobStore, job: Job) -> list[Node]:
    """The job's hot spares still standing by (whichever attempt launched them)."""
    return sorted((n for n in store.nodes_of(job.job_id) if n.spare and n.state in SPARE_LIVE
                   and n.takes_rank is None), key=lambda n: n.rank)


SPARE_LIVE = (NodeState.PENDING, NodeState.READY, NodeState.RUNNING)


# a node record in one of these says how its node ended: it is not live and keeps that state
ENDED = (NodeState.TERMINATED, NodeState.LOST, NodeState.EXITED)


def standing_by(nodes: Iterable[Node]) -> list[Node]:
    """The rebalance standbys still waiting for a notice (services/prewarm.py): billed, and charged to
    the ledger when they are released, take a rank or are torn down with the job."""
    return [n for n in nodes if n.spare and n.release_after is not None and n.state in SPARE_LIVE
            and n.takes_rank is None]


def end_records(store: JobStore, job_id: str, nodes: list[Node],
                keep: tuple[NodeState, ...] = ENDED) -> list[Node]:
    """Mark TERMINATED each of ``nodes`` whose record is in no ``keep`` state (TERMINATED is always
    kept; the write checks the stored state again). Returns the nodes it marked, as given."""
    keep = (*keep, NodeState.TERMINATED)
    marked = []
    for node in nodes:
        if node.state in keep:
            continue
        store.update_node(job_id, node.node_id, lambda n: None if n.state in keep
                          else n.model_copy(update={"state": NodeState.TERMINATED}))
        marked.append(node)
    return marked


def unannounced_reclaim(ctl: Controller, node: Node, now: float) -> dict[str, Any]:
    """The fields a node lost without a notice we saw (its state-change event, or a silent heartbeat)
    gets besides its state: ``ec2_reclaim_at`` = ``now`` when it was EC2's interruption (its notice is
    best effort), none for a crash. Only EC2's own record tells them apart (``Compute.spot_reclaimed``);
    the ledger must know, as EC2 bills nothing of a spot instance it interrupts in its first hour.
    Never raises: the loss must be recorded whatever the answer (an error reads as a crash: billed)."""
    if node.pool.market != "spot" or ctl.compute is None or node.ec2_reclaim_at is not None:
        return {}
    try:
        taken = ctl.compute.spot_reclaimed(node.instance_id, node.pool.region)
    except Exception:  # (a compute port that cannot be built or answer: the ledger's safe side)
        log.exception("could not tell EC2's reclaim from a crash", extra={"instance_id": node.instance_id})
        return {}
    return {"ec2_reclaim_at": now} if taken else {}


def price_in_effect(ctl: Controller, job: Job, now: float) -> tuple[int, float] | None:
    """(attempt number, USD per instance-hour) EC2 billed the job's open spot attempt at from its start
    to ``now`` on average (``MarketData.price_history``, ``mean_price``): what its close counts it at, as
    AWS bills the price in effect, not the launch price. None (the launch price stands) for on-demand, a
    closed or unstarted attempt, or a history that cannot be read. Asked before a close's write (an
    update retried on a conflict must not call EC2 again). Never raises: a close must not fail for it."""
    current = job.attempts[-1] if job.attempts else None
    if current is None or not open_spot(current) or ctl.market is None:
        return None
    assert current.pool is not None and current.started_at is not None  # (open_spot)
    try:
        history = ctl.market.price_history(current.pool, current.started_at, now)
    except Exception:  # (a market port that cannot be built or answer: the launch price, as before)
        log.exception("spot price history unavailable; the ledger keeps the launch price",
                      extra={"job_id": job.job_id, "pool": current.pool.key})
        return None
    if not history:
        return None
    return current.number, mean_price(history, current.started_at, now, current.price_per_hour)


def release_nodes(ctl: Controller, job: Job, nodes: list[Node], now: float) -> list[str]:
    """Mark the nodes TERMINATED, then terminate their instances (so the state-change events that
    follow are recognised as ours). Already terminated nodes are skipped; returns instance ids.
    A spot instance EC2 has noticed in its first hour is left for EC2 to take (``leave_to_ec2``:
    EC2's interruption of it is not billed, our termination would be); reconcile terminates it if
    it outlives its reclaim (``reconcile._left_to_ec2``). One that outlived its attempt's close (a
    drained rank) is charged to the ledger for that time (``charge_outlived_nodes``)."""
    by_region: dict[str, list[str]] = {}
    billed: list[Node] = []
    for node in end_records(ctl.store, job.job_id, nodes, keep=()):
        if leave_to_ec2(node.pool.market, node.launched_at, node.ec2_reclaim_at):
            log.info("left to EC2's reclaim (not billed in its first hour)",
                     extra={"job_id": job.job_id, "instance_id": node.instance_id, "reclaim_at": node.ec2_reclaim_at})
            continue
        by_region.setdefault(node.pool.region, []).append(node.instance_id)
        billed.append(node)
    for region, ids in by_region.items():
        ctl.need_compute().terminate(ids, region)
    charge_outlived_nodes(ctl, job.job_id, billed, now)
    return sorted(i for ids in by_region.values() for i in ids)


def charge_outlived_nodes(ctl: Controller, job_id: str, nodes: list[Node], now: float) -> None:
    """Add to the ledger what ``nodes`` (released now, each once: ``end_records`` marked it) were billed
    past their attempt's close (``domain/cost.charge_outlived``): a move's leaving ranks and survivors
    dropped mid-save run on to their final save after the workflow closed their attempt. A hot spare's
    own cost is counted apart (services/prewarm.py)."""
    outlived = [(n.attempt, n.launched_at) for n in nodes if not n.spare]
    if not outlived:
        return

    def charge(cur: Job) -> Job | None:
        attempts, extra = charge_outlived(cur.attempts, outlived, now)
        if not extra:
            return None
        return cur.model_copy(update={"attempts": attempts, "cost_so_far": cur.cost_so_far + extra})

    ctl.store.update_job(job_id, charge)
