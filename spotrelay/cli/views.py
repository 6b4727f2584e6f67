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


def show_attempts(console: Console, job: Job, nodes: Iterable[Node] = (), newest: int | None = None) -> None:
    """The attempts table; ``newest``: only that many of the newest (a long job's status stays short)."""
    rows = attempt_rows(job, nodes)
    shown = rows if newest is None else rows[-newest:]
    show(console, ATTEMPT_HEADERS, shown, title="attempts")
    if len(shown) < len(rows):
        console.print(f"and {len(rows) - len(shown)} earlier attempts in the job record (`spotrelay describe` and "
                      "`spotrelay cost` list them)", highlight=False)
    if job.earlier is not None and job.earlier.count:
        console.print(folded_line(job.earlier.count, job.earlier.paid), highlight=False)


def folded_line(count: int, cost: float) -> str:
    """The attempts a job record folded (services/history.py), under its attempts table."""
    from spotrelay.services.history import ATTEMPTS_KEPT

    return (f"and {count} earlier attempts (${cost:.2f}), folded out of the job record: it keeps the newest "
            f"{ATTEMPTS_KEPT} (their costs are in the totals)")


def show_nodes(console: Console, nodes: list[Node], attempt: int | None = None) -> None:
    """The node records; ``attempt``: only that attempt's and those of earlier attempts still in use (a hot
    spare standing by, a rank still saving: the records the reconcile sweep keeps whatever their attempt,
    ``node_history.in_use``), with a count of the rest."""
    from spotrelay.services.node_history import in_use

    now = time.time()
    shown = nodes if attempt is None else [n for n in nodes if n.attempt >= attempt or in_use(n, now)]
    rows = [[n.node_id, str(n.rank), n.instance_id, n.pool.key, n.state.value, n.private_ip or "-"]
            for n in sorted(shown, key=lambda n: (n.attempt, n.rank))]
    show(console, NODE_HEADERS, rows, title="nodes")
    if len(shown) < len(nodes):
        console.print(f"and {len(nodes) - len(shown)} ended node records of earlier attempts (--json has them)",
                      highlight=False)
