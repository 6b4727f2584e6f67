"""Tables the CLI prints for one job: its attempts and its nodes."""

from __future__ import annotations

import time
from collections.abc import Iterable

from rich.console import Console

from spotrelay.cli.tables import show
from spotrelay.domain.models import Job, Node


def _when(at: float | None) -> str:
    return time.strftime("%m-%d %H:%M:%S", time.gmtime(at)) if at else "-"


ATTEMPT_HEADERS = ("attempt", "pool", "nodes", "started (UTC)", "ended (UTC)", "end reason", "resumed from",
                   "reached", "lost", "cost $")
NODE_HEADERS = ("node", "rank", "instance", "pool", "state", "ip")


def attempt_rows(job: Job, nodes: Iterable[Node] = ()) -> list[list[str]]:
    """One row per launch: where, how many nodes, how it ended, which step it resumed from, how far it
    trained and how many of those steps no checkpoint kept. With the job's ``nodes``, a closed attempt's
    cost counts its ranks still draining their save."""
    from spotrelay.services.describe import cost_report

    lines = cost_report(job, time.time(), nodes).lines
    cost_of = {line.attempt: line.cost for line in lines}  # (running: its clock)
    return [[str(a.number), a.pool.key if a.pool else "-", str(a.nodes or "-"), _when(a.started_at),
             _when(a.ended_at), a.end_reason or ("running" if a.ended_at is None else "-"),
             f"step {a.resumed_from_step}" if a.resumed_from_step is not None else "start",
             "-" if a.reached_step is None else str(a.reached_step),
             "-" if a.lost_steps is None else str(a.lost_steps), f"{cost_of[a.number]:.2f}"] for a in job.attempts]


def show_attempts(console: Console, job: Job, nodes: Iterable[Node] = ()) -> None:
    show(console, ATTEMPT_HEADERS, attempt_rows(job, nodes), title="attempts")
    if job.earlier is not None and job.earlier.count:
        console.print(folded_line(job.earlier.count, job.earlier.paid), highlight=False)


def folded_line(count: int, cost: float) -> str:
    """The attempts a job record folded (services/history.py), under its attempts table."""
    from spotrelay.services.history import ATTEMPTS_KEPT

    return (f"and {count} earlier attempts (${cost:.2f}), folded out of the job record: it keeps the newest "
            f"{ATTEMPTS_KEPT} (their costs are in the totals)")


def show_nodes(console: Console, nodes: list[Node]) -> None:
    rows = [[n.node_id, str(n.rank), n.instance_id, n.pool.key, n.state.value, n.private_ip or "-"]
            for n in sorted(nodes, key=lambda n: (n.attempt, n.rank))]
    show(console, NODE_HEADERS, rows, title="nodes")
