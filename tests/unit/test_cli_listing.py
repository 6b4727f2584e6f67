"""Which jobs ``spotrelay jobs --status`` lists (spotrelay/cli/listing.py)."""

from __future__ import annotations

import pytest

from spotrelay.adapters.memory_job_store import MemoryJobStore
from spotrelay.cli.errors import UsageProblem
from spotrelay.cli.listing import GROUPS, parse_statuses, read_jobs
from spotrelay.domain.models import Job
from spotrelay.domain.status import TERMINAL, JobStatus


def test_statuses_and_groups_in_any_case_once_each() -> None:
    assert parse_statuses("Running") == (JobStatus.RUNNING,)
    assert parse_statuses("failed, RUNNING,failed") == (JobStatus.FAILED, JobStatus.RUNNING)
    assert set(parse_statuses("active")) | set(parse_statuses("ended")) == set(JobStatus)
    assert set(parse_statuses("ended")) == TERMINAL and JobStatus.SUBMITTED in GROUPS["active"]
    assert parse_statuses("ended,cancelled") == GROUPS["ended"]


@pytest.mark.parametrize(("text", "named"), [("runing", "'runing' is not a job status"), ("", "names no status"),
                                             (",", "names no status"), ("live", "'live' is not"),
                                             ("x" * 5000, "'" + "x" * 40 + "...' is not")])
def test_a_word_that_is_no_status_is_named(text: str, named: str) -> None:
    with pytest.raises(UsageProblem, match=named) as err:
        parse_statuses(text)
    assert str(err.value).startswith("--status: ") and "active, ended or submitted, validated" in str(err.value)


class _Moved(MemoryJobStore):
    """A store read while one job moved from RUNNING to RECOVERING: the RUNNING read still holds it."""

    def __init__(self, stale: Job) -> None:
        super().__init__()
        self.stale = stale

    def jobs_by_status(self, status: JobStatus) -> list[Job]:
        found = super().jobs_by_status(status)
        return [*found, self.stale] if status is JobStatus.RUNNING else found


def test_a_job_read_under_two_statuses_is_listed_once_as_its_newer_record() -> None:
    store = _Moved(Job(job_id="j-moved", name="llm", status=JobStatus.RUNNING, created_at=5, updated_at=5))
    store.create_job(Job(job_id="j-first", name="llm", status=JobStatus.RUNNING, created_at=1, updated_at=1))
    store.create_job(store.stale)
    read = store.get_job("j-moved")
    store.stale = read  # what the RUNNING read saw, before the job moved on
    store.save_job(read.model_copy(update={"status": JobStatus.RECOVERING}), JobStatus.RUNNING, read.version)
    listed = read_jobs(store, (JobStatus.RECOVERING, JobStatus.RUNNING))  # (the stale copy read last)
    assert [(j.job_id, j.status) for j in listed] == [("j-first", JobStatus.RUNNING),
                                                      ("j-moved", JobStatus.RECOVERING)]
    assert [j.job_id for j in read_jobs(store, GROUPS["active"])] == ["j-first", "j-moved"]
    assert read_jobs(store, tuple(JobStatus)) == store.all_jobs()
