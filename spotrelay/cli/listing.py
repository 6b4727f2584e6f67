"""Which jobs ``spotrelay jobs --status`` lists.

A deployment keeps every job it ever ran (``describe`` and ``resume`` read the ended ones), so a team's
table grows for as long as it trains. Reading it whole is a scan of every job record (up to DynamoDB's
400 KB each); a status selection reads only those statuses through the table's ``by-status`` index.
"""

from __future__ import annotations

from collections.abc import Iterable

from spotrelay.cli.errors import UsageProblem
from spotrelay.domain.models import Job
from spotrelay.domain.status import TERMINAL, JobStatus
from spotrelay.ports.job_store import JobStore

# what ``--status`` takes besides a status's own name: every status not ended, and every ended one
GROUPS: dict[str, tuple[JobStatus, ...]] = {
    "active": tuple(s for s in JobStatus if s not in TERMINAL),
    "ended": tuple(s for s in JobStatus if s in TERMINAL),
}


def parse_statuses(text: str) -> tuple[JobStatus, ...]:
    """``--status``: statuses and groups, comma-separated, in any case (``running``, ``active,failed``);
    a usage problem naming the word that is neither, with what the option takes."""
    chosen: list[JobStatus] = []
    words = [w.strip() for w in text.split(",")]
    if not any(words):
        raise UsageProblem(f"--status: names no status; {_takes()}")
    for word in words:
        if not word:
            continue
        key = word.lower()
        if key in GROUPS:
            found: Iterable[JobStatus] = GROUPS[key]
        elif key.upper() in JobStatus.__members__:
            found = (JobStatus[key.upper()],)
        else:
            shown = word if len(word) <= 40 else word[:40] + "..."  # (one line, whatever was typed)
            raise UsageProblem(f"--status: {shown!r} is not a job status; {_takes()}")
        chosen.extend(s for s in found if s not in chosen)
    return tuple(chosen)


def _takes() -> str:
    return f"it takes {', '.join(GROUPS)} or {', '.join(s.value.lower() for s in JobStatus)}, comma-separated"


def read_jobs(store: JobStore, statuses: tuple[JobStatus, ...]) -> list[Job]:
    """The jobs in ``statuses``, each status read through the by-status index (never a scan), oldest
    submission first. A job that moved between two statuses' reads may come from both: its newer record
    is kept, whichever status it now holds. (It may also come from neither, moving from a status not
    read yet to one read already: fine for a listing, not for a check; ``resume`` scans.)"""
    newest: dict[str, Job] = {}
    for status in statuses:
        for job in store.jobs_by_status(status):
            seen = newest.get(job.job_id)
            if seen is None or job.version > seen.version:
                newest[job.job_id] = job
    return sorted(newest.values(), key=lambda j: (j.created_at, j.job_id))
