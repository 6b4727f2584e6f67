"""The job store contract, run against both adapters: DynamoDB on moto's server and the in-memory
store the property tests use (the same conditional writes, races and queries)."""

from __future__ import annotations

import threading

import pytest

from spotrelay.adapters.dynamodb_job_store import DynamoDBJobStore
from spotrelay.adapters.memory_job_store import MemoryJobStore
from spotrelay.domain.models import Job, Node, Pool
from spotrelay.domain.status import JobStatus
from spotrelay.errors import AlreadyExistsError, ConflictError, NotFoundError
from spotrelay.ports.job_store import JobStore

POOL = Pool(region="us-east-1", az="us-east-1a", instance_type="p5.48xlarge", market="spot")


@pytest.fixture(params=["dynamodb", "memory"])
def store(request: pytest.FixtureRequest) -> JobStore:
    if request.param == "memory":
        return MemoryJobStore()
    request.getfixturevalue("aws")
    return DynamoDBJobStore()


def _job(job_id: str = "j-1", status: JobStatus = JobStatus.SUBMITTED) -> Job:
    return Job(job_id=job_id, name="n", status=status, created_at=1.0, updated_at=1.0)


def test_create_get_and_duplicate(store: JobStore) -> None:
    store.create_job(_job())
    assert store.get_job("j-1").status is JobStatus.SUBMITTED
    with pytest.raises(AlreadyExistsError):
        store.create_job(_job())
    with pytest.raises(NotFoundError):
        store.get_job("nope")


def test_conditional_write_refuses_stale_version(store: JobStore) -> None:
    store.create_job(_job())
    current = store.get_job("j-1")
    saved = store.save_job(current.model_copy(update={"status": JobStatus.VALIDATED}), current.status, 0)
    assert saved.version == 1
    with pytest.raises(ConflictError):
        store.save_job(current.model_copy(update={"status": JobStatus.REJECTED}), JobStatus.SUBMITTED, 0)
    assert store.get_job("j-1").status is JobStatus.VALIDATED


def test_two_writers_one_wins(store: JobStore) -> None:
    store.create_job(_job())
    current = store.get_job("j-1")
    barrier = threading.Barrier(2)
    outcomes: list[str] = []

    def write(target: JobStatus) -> None:
        barrier.wait()
        try:
            store.save_job(current.model_copy(update={"status": target}), current.status, current.version)
            outcomes.append(f"won:{target}")
        except ConflictError:
            outcomes.append("lost")

    threads = [threading.Thread(target=write, args=(s,)) for s in (JobStatus.VALIDATED, JobStatus.REJECTED)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(o.split(":")[0] for o in outcomes) == ["lost", "won"]
    winner = next(o for o in outcomes if o.startswith("won")).split(":")[1]
    final = store.get_job("j-1")
    assert final.status.value == winner and final.version == 1


def test_queries_by_status_and_instance(store: JobStore) -> None:
    store.create_job(_job("a", JobStatus.RUNNING))
    store.create_job(_job("b", JobStatus.RUNNING))
    store.create_job(_job("c", JobStatus.FAILED))
    assert sorted(j.job_id for j in store.jobs_by_status(JobStatus.RUNNING)) == ["a", "b"]
    store.put_node(Node(job_id="a", node_id="a1-r0", attempt=1, rank=0, instance_id="i-0abc", pool=POOL))
    store.put_node(Node(job_id="a", node_id="a1-r1", attempt=1, rank=1, instance_id="i-0def", pool=POOL))
    assert [n.node_id for n in store.nodes_of("a")] == ["a1-r0", "a1-r1"]
    found = store.node_by_instance("i-0def")
    assert found is not None and found.rank == 1
    assert store.node_by_instance("i-missing") is None
    with pytest.raises(AlreadyExistsError):
        store.put_node(Node(job_id="a", node_id="a1-r0", attempt=1, rank=0, instance_id="i-0abc", pool=POOL))


def test_update_job_retries_lost_race(store: JobStore) -> None:
    store.create_job(_job())
    calls = {"n": 0}

    def change(job: Job) -> Job:
        calls["n"] += 1
        if calls["n"] == 1:  # someone else writes between our read and our write
            store.save_job(job.model_copy(update={"reasons": ["other"]}), job.status, job.version)
        return job.model_copy(update={"status": JobStatus.VALIDATED})

    result = store.update_job("j-1", change)
    assert result is not None and result.status is JobStatus.VALIDATED and result.version == 2
    assert calls["n"] == 2


def test_node_replace_is_conditional_on_version(store: JobStore) -> None:
    node = store.put_node(Node(job_id="a", node_id="a1-r0", attempt=1, rank=0, instance_id="i-0abc", pool=POOL))
    assert node.version == 1
    moved = store.put_node(node.model_copy(update={"private_ip": "10.0.0.1"}), expected_version=1)
    assert moved.version == 2
    with pytest.raises(ConflictError):  # a writer that read version 1 lost
        store.put_node(node.model_copy(update={"private_ip": "10.0.0.9"}), expected_version=1)
    read = store.get_node("a", "a1-r0")
    assert read.private_ip == "10.0.0.1" and read.version == 2
    read.private_ip = "mutated"  # what a caller holds is its own copy
    assert store.get_node("a", "a1-r0").private_ip == "10.0.0.1"
    assert store.update_node("a", "a1-r0", lambda n: None) is None  # nothing to change: nothing written
    assert store.get_node("a", "a1-r0").version == 2
    with pytest.raises(NotFoundError):
        store.get_node("a", "a9-r9")


def test_an_attempts_ledger_figures_round_trip(store: JobStore) -> None:
    """Cost and the minutes billed past the close (``drain_cost``) come back as written, floats."""
    from spotrelay.domain.models import Attempt

    attempt = Attempt(number=1, pool=POOL, started_at=1000.5, ended_at=4600.25, cost=123.456789,
                      drain_cost=1.0000001, price_per_hour=36.12, nodes=16)
    store.create_job(_job().model_copy(update={"attempts": [attempt], "cost_so_far": 124.4567891}))
    back = store.get_job("j-1")
    assert back.attempts == [attempt] and back.cost_so_far == 124.4567891
    assert isinstance(back.attempts[0].drain_cost, float)
