"""What a job's own history says a spec field would change, in words for ``spotrelay describe``.

A fixed gang (``resources.min_nodes`` unset or equal to ``nodes``) on spot pools that seldom hold it
restarts whole: every loss is a new gang's boot and restore, billed and not training. Each attempt's
record has its launch (``started_at``), its trainers' resume (``resumed_at``) and its end, so the share
of its life spent bringing it up is measured, not modeled. Where the job's last spot gangs spent
``BRING_UP_SHARE`` or more of their time that way, an elastic gang (``min_nodes``) trains on the nodes
a pool still holds instead: on the simulator's g4dn trace at 16 nodes the fixed gang's share is 0.23
(boot 0.17, restore 0.06) and ``min_nodes: 8`` takes goodput from 0.70 to 0.83 (docs/simulator.md).
The threshold and the window from the simulator's own records (72 h jobs, 8 seeds, the newest 16
attempts at the end): the g4dn trace at 16 nodes 0.21-0.49 (advised), at 8 nodes 0.05-0.09, under
Bamboo's settings (a 45 s boot) at 16 nodes 0.09-0.14 (not advised: a restart costs little there), the
trace's node reading at 8 and 16 nodes 0.26-0.91; the p3 trace and the synthetic market under 0.03.
The newest 8 attempts alone spread too far (0.13 at 8 nodes, 0.15 at 16 on one seed each).

A notice is worth its checkpoint only if each rank's share flushes inside the window. Where the ranks'
last save took longer than a notice left them (the agent's ``deadline-at-risk``, recorded on the attempt)
on half or more of the job's recent noticed gangs, every such reclaim redoes the work since the last
periodic save: the simulator's stated job (1,120 GB) on 2 nodes flushes in 135 s against the 120 s
notice, and spotrelay there costs what managed-jobs tools do, 4% less once each node's share flushes
in 68 s (docs/simulator.md, target (c)). More nodes make each share smaller.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from spotrelay.contracts.recovery import gang_lost
from spotrelay.domain.models import Attempt

BRING_UP_SHARE = 0.2  # of the spot gangs' time: at or above it the advice is given
MIN_GANGS = 4  # spot gangs lost (not ended by a move, a stop or success) before the share says anything
LOOKBACK = 16  # the job's newest attempts looked at: the market it runs in now (8 was noisy: below)
MIN_NOTICES = 3  # noticed gangs before the notice advice says anything
AT_RISK_SHARE = 0.5  # of them, at risk: at or above it the notice advice is given


def _fixed_size(spec: Mapping[str, Any] | None) -> int | None:
    """The gang size of a stored spec that does not let the gang shrink, else None (elastic, a single
    node, or a record this release cannot read: no advice rather than a wrong one)."""
    resources = (spec or {}).get("resources")
    if not isinstance(resources, Mapping):
        return None
    nodes, smallest = resources.get("nodes"), resources.get("min_nodes")
    if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 2:
        return None
    if smallest is not None and (not isinstance(smallest, int) or smallest < nodes):
        return None
    return nodes


def _span(a: Attempt) -> tuple[float, float] | None:
    """(seconds from its launch to its trainers' resume, to its end) of a closed attempt; a gang lost
    before its trainers resumed spent its whole life coming up."""
    if (a.started_at is None or a.ended_at is None or not math.isfinite(a.ended_at - a.started_at)
            or a.ended_at < a.started_at or (a.resumed_at is not None and not math.isfinite(a.resumed_at))):
        return None  # (open, or times no release writes)
    resumed = a.ended_at if a.resumed_at is None else min(max(a.resumed_at, a.started_at), a.ended_at)
    return resumed - a.started_at, a.ended_at - a.started_at


def bring_up_share(attempts: Sequence[Attempt]) -> tuple[float, int, float] | None:
    """(share of their time before their trainers resumed, how many, mean life in seconds) of the spot
    gangs a loss ended among the newest ``LOOKBACK`` attempts; None with fewer than ``MIN_GANGS``, or
    for a record without resume times (an older release's: every gang would look like bring-up)."""
    if not any(a.resumed_at is not None for a in attempts):
        return None
    spans = [span for a in attempts[-LOOKBACK:]
             if a.pool is not None and a.pool.market == "spot" and gang_lost(a.end_reason)
             and (span := _span(a)) is not None]
    life = sum(total for _, total in spans)
    if len(spans) < MIN_GANGS or life <= 0.0:
        return None
    return sum(up for up, _ in spans) / life, len(spans), life / len(spans)


def elastic_advice(spec: Mapping[str, Any] | None, attempts: Sequence[Attempt]) -> str | None:
    """One line for people when a fixed gang's restarts cost it ``BRING_UP_SHARE`` or more; else None."""
    nodes = _fixed_size(spec)
    measured = bring_up_share(attempts) if nodes is not None else None
    if nodes is None or measured is None or measured[0] < BRING_UP_SHARE:
        return None
    share, gangs, life = measured
    return (f"the last {gangs} spot gangs of {nodes} nodes spent {share:.0%} of their time booting and restoring "
            f"(each lasted {life / 60:.0f} min on average; a loss stops the whole gang until it is whole again): "
            f"resources.min_nodes lets the job train on the nodes a pool still holds (docs/job-spec.md; "
            f"`spotrelay simulate --spec JOB.yaml --variant elastic:min_nodes={max(1, nodes // 2)}` shows it "
            f"beside the fixed gang first)")


def notices_at_risk(attempts: Sequence[Attempt]) -> tuple[int, int]:
    """(how many were at risk, how many) of the gangs a notice ended among the job's newest
    ``LOOKBACK`` attempts: at risk, the notice reached ranks whose last save took longer than it left."""
    noticed = [a for a in attempts[-LOOKBACK:] if a.end_reason == "interrupted"]
    return sum(1 for a in noticed if a.notice_at_risk), len(noticed)


def notice_risk_share(attempts: Sequence[Attempt]) -> float:
    """The share of the job's recent noticed gangs whose notice save could not be counted on (0 with
    none): the auto checkpoint cadence counts those reclaims as losing work (domain/cadence.py)."""
    risky, noticed = notices_at_risk(attempts)
    return risky / noticed if noticed else 0.0


def notice_advice(attempts: Sequence[Attempt]) -> str | None:
    """One line when the notices of half or more of the job's newest noticed gangs (at least
    ``MIN_NOTICES``) reached ranks whose last save took longer than the notice left; else None."""
    risky, noticed = notices_at_risk(attempts)
    if noticed < MIN_NOTICES or risky < AT_RISK_SHARE * noticed:
        return None
    return (f"on {risky} of the last {noticed} spot notices the ranks' last save took longer than the notice "
            "left (the agent's deadline-at-risk): such a reclaim redoes the steps since the last periodic save. "
            "Each node's share of the checkpoint must flush inside the 2-minute window: more nodes make it "
            "smaller; a shorter checkpoint.every_minutes bounds what a reclaim redoes (`auto` counts such reclaims "
            "as losses; docs/checkpoints.md)")


def job_advice(spec: Mapping[str, Any] | None, attempts: Sequence[Attempt]) -> list[str]:
    """Every advice the job's own history gives (describe, the interrupted notification, the simulator)."""
    return [line for line in (elastic_advice(spec, attempts), notice_advice(attempts)) if line]
