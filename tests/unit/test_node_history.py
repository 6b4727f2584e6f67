"""What the reconcile sweep may delete of a long job's node records (services/node_history.prunable): never
a live record (a rank of any attempt not yet ended, a spare standing by, a rank still draining its save),
never one of the newest attempts, and every old record whose node ended or whose instance went on in a
newer record."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from spotrelay.domain.models import Job, Node, NodeState, Pool
from spotrelay.domain.status import JobStatus
from spotrelay.services.controller import ENDED
from spotrelay.services.node_history import NODE_ATTEMPTS_KEPT, PRUNE_PER_SWEEP, prunable

POOL = Pool(region="us-east-1", az="us-east-1a", instance_type="p5.48xlarge", market="spot")
NOW = 1_000_000.0

records = st.lists(st.tuples(st.integers(1, 30), st.integers(0, 3), st.sampled_from(list(NodeState)),
                             st.integers(0, 5), st.sampled_from([None, NOW - 1, NOW + 1]), st.booleans()),
                   max_size=60, unique_by=lambda r: (r[0], r[1]))


def _nodes(rows: list[tuple[int, int, NodeState, int, float | None, bool]]) -> list[Node]:
    return [Node(job_id="j", node_id=f"a{a}-r{r}", attempt=a, rank=r, instance_id=f"i-{inst}", pool=POOL,
                 state=state, release_after=release, spare=spare) for a, r, state, inst, release, spare in rows]


@settings(max_examples=300, deadline=None)
@given(records, st.integers(1, 30))
def test_only_what_no_reader_needs_goes(rows: list[tuple[int, int, NodeState, int, float | None, bool]],
                                        attempt: int) -> None:
    nodes = _nodes(rows)
    job = Job(job_id="j", name="j", status=JobStatus.RUNNING, attempt=attempt)
    gone = {n.node_id for n in prunable(job, nodes, NOW)}
    newest = {n.instance_id: max(m.attempt for m in nodes if m.instance_id == n.instance_id) for n in nodes}
    for n in nodes:
        old = n.attempt <= attempt - NODE_ATTEMPTS_KEPT
        carried = newest[n.instance_id] > n.attempt
        settled = n.state in ENDED and (n.release_after is None or n.release_after <= NOW)
        assert (n.node_id in gone) == (old and (carried or settled)), n
    for instance, top in newest.items():  # each instance keeps its newest record unless that one ended
        record = next(n for n in nodes if n.instance_id == instance and n.attempt == top)
        if record.state not in ENDED or (record.release_after or 0) > NOW:
            assert record.node_id not in gone


def test_a_sweep_deletes_a_bounded_number() -> None:
    rows = [(a, r, NodeState.TERMINATED, 100 * a + r, None, False) for a in range(1, 400) for r in range(4)]
    job = Job(job_id="j", name="j", status=JobStatus.RUNNING, attempt=400)
    assert len(prunable(job, _nodes(rows), NOW)) == PRUNE_PER_SWEEP
