"""The agent's side of recovery inside the notice window: replacements wait for the ranks left to
drain, and a hot spare's bench loop."""

from __future__ import annotations

from pathlib import Path

from agent.spare import SpareCache, StandBy, draining_ranks, wait_for_drain
from spotrelay.contracts.agent import NodeView
from spotrelay.domain.models import NodeState


def node(attempt: int, rank: int, state: NodeState, release_after: float | None = None,
         spare: bool = False) -> NodeView:
    """A node record as the agent's port shows it."""
    return NodeView(job_id="j", node_id=f"a{attempt}-r{rank}", attempt=attempt, rank=rank,
                    instance_id=f"i-{attempt}{rank}", state=state.value, release_after=release_after, spare=spare)


def test_replacements_wait_only_for_ranks_still_draining() -> None:
    nodes = [
        node(1, 0, NodeState.RUNNING),  # a kept survivor: the rendezvous waits for it, not this gate
        node(1, 1, NodeState.DOOMED, release_after=150.0),  # saving after the notice
        node(1, 2, NodeState.EXITED, release_after=150.0),  # done
        node(1, 3, NodeState.RUNNING, release_after=150.0, spare=True),  # a standby is not draining
        node(2, 1, NodeState.PENDING),
    ]
    assert draining_ranks(nodes, attempt=2, now=100.0) == [1]
    assert draining_ranks(nodes, attempt=2, now=150.0) == []  # bounded: the reclaim time passed
    assert draining_ranks(nodes, attempt=1, now=100.0) == []


def test_wait_for_drain_returns_when_the_rank_exited() -> None:
    states = iter([NodeState.DOOMED, NodeState.DOOMED, NodeState.EXITED])
    slept: list[float] = []
    wait_for_drain(lambda: [node(1, 1, next(states), release_after=1e12)], 2, lambda: 0.0, slept.append,
                   lambda: False)
    assert slept == [1.0, 1.0]


def test_a_spare_leaves_the_bench_when_no_longer_wanted(tmp_path: Path) -> None:
    cache = SpareCache(tmp_path, None)  # no S3 tier: nothing to mirror
    assert cache.refresh() is None
    wanted = iter([True, False])
    bench = StandBy(cache, lambda: next(wanted))
    assert bench.tick() is True and bench.tick() is False
