"""A long job's node records, bounded.

Every attempt writes a record per instance (``a<attempt>-r<rank>``: a survivor or a promoted spare gets
a new one), and none was ever removed. A fixed 16-node gang on a stormy market starts an attempt every
half hour, ~800 records a day, and every ``nodes_of`` (each wait's settle, recover, provision, the
reconcile's sweeps, the CLI) reads them all with a consistent query: its latency and read units grew
with the job's age (two weeks: ~11,000 items, several MB a call). The reconcile sweep deletes what no
reader needs any more (``prunable``): a record of an attempt older than the newest
``NODE_ATTEMPTS_KEPT`` whose node ended (TERMINATED, LOST, EXITED) and is not draining a save, or whose
instance a newer record carries. Live records of any attempt stay: a hot spare standing by, a rank
still saving. Each deletion is conditional on the version read, so a record that changed meanwhile
stays until the next sweep. What the attempts cost is on the job record (its ledger), not here.
"""

from __future__ import annotations

import logging

from spotrelay.domain.models import Job, Node
from spotrelay.services.controller import ENDED, Controller

log = logging.getLogger(__name__)

NODE_ATTEMPTS_KEPT = 5  # the newest attempts whose node records all stay (describe, the orphans' charges)
PRUNE_PER_SWEEP = 400  # deletions per job and sweep: a long job's backlog goes over a few sweeps


def in_use(node: Node, now: float) -> bool:
    """A record some reader still needs whatever its attempt: its node has not ended (a hot spare standing
    by, a rank training or saving), or ended with its instance kept for its save until ``release_after``."""
    return node.state not in ENDED or (node.release_after is not None and node.release_after > now)


def prunable(job: Job, nodes: list[Node], now: float) -> list[Node]:
    """The records of ``nodes`` that no reader needs: of an attempt at least ``NODE_ATTEMPTS_KEPT``
    behind the job's, ended and not draining, or carried into a newer record of the same instance."""
    newest: dict[str, int] = {}
    for n in nodes:
        newest[n.instance_id] = max(newest.get(n.instance_id, n.attempt), n.attempt)
    floor = job.attempt - NODE_ATTEMPTS_KEPT
    out = [n for n in nodes if n.attempt <= floor and (newest[n.instance_id] > n.attempt or not in_use(n, now))]
    return out[:PRUNE_PER_SWEEP]


def prune(ctl: Controller, job: Job, now: float) -> int:
    """Delete ``job``'s prunable node records; how many went."""
    gone = sum(ctl.store.delete_node(n) for n in prunable(job, ctl.store.nodes_of(job.job_id), now))
    if gone:
        log.info("old node records deleted", extra={"job_id": job.job_id, "deleted": gone})
    return gone
