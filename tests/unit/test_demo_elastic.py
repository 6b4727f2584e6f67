"""``demo --scenario elastic``: the script that shrinks and restores the twin's capacity, and how the run
is judged (world sizes from the node records, every step's loss against the reference)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from spotrelay.domain.models import Node, Pool
from spotrelay.errors import InsufficientCapacityError
from spotrelay.local.demo_elastic import (
    ElasticScript,
    elastic_spec,
    judge,
    losses_by_attempt,
    split_runs,
    world_sizes,
)
from spotrelay.local.market import MarketModel

POOL = Pool(region="us-east-1", az="us-east-1a", instance_type="p5.48xlarge", market="spot")


def _node(attempt: int, rank: int, iid: str, spare: bool = False) -> Node:
    return Node(job_id="j", node_id=f"a{attempt}-r{rank}", attempt=attempt, rank=rank, instance_id=iid, pool=POOL,
                spare=spare)


def test_the_spec_becomes_elastic_with_its_global_batch_pinned_and_no_dropout() -> None:
    data = {"resources": {"nodes": 3}, "entrypoint": {"args": ["--batch", "2"]}}
    out = elastic_spec(data)
    assert out["resources"]["min_nodes"] == 2
    assert out["entrypoint"]["args"] == ["--batch", "2", "--global-batch", "6", "--dropout", "0"]
    assert out["recovery"]["review_minutes"] == 0.5


def test_capacity_shrinks_at_the_notice_and_returns_after_the_smaller_gang_trained() -> None:
    market = MarketModel()
    script = ElasticScript(market, nodes=2, notice_step=20, grow_after_steps=10)
    (action,) = script.chaos()
    assert (action.kind, action.node, action.at_step, action.limit_nodes) == ("interrupt", "1", 20, 1)
    market.limit_capacity(action.limit_nodes or 0)  # what the chaos driver does before the notice
    with pytest.raises(InsufficientCapacityError):
        market.check_capacity(POOL, count=1, live=1)  # no room for the replacement next to the survivor
    script.on_notice(1000.0)
    script.on_resumed(2, 20, world=2)  # a full-size resume schedules nothing
    assert script.tick(100, 1001.0) is None
    script.on_resumed(2, 20, world=1)
    assert script.tick(29, 1002.0) is None and market.limits
    assert "(step 30)" in (script.tick(30, 1003.0) or "") and not market.limits
    market.check_capacity(POOL, count=1, live=1)
    assert script.tick(40, 1004.0) is None  # once


def test_capacity_returns_anyway_when_no_smaller_gang_resumed() -> None:
    market = MarketModel()
    script = ElasticScript(market, nodes=3, notice_step=20, grow_after_steps=10, give_up_s=60)
    market.limit_capacity(2)
    assert script.tick(25, 50.0) is None  # no notice yet
    script.on_notice(100.0)
    assert script.tick(25, 159.0) is None
    assert "no smaller gang resumed within 60 s" in (script.tick(25, 160.0) or "") and not market.limits


def test_judge_wants_a_smaller_attempt_a_full_last_one_and_losses_within_1e4() -> None:
    ref = {1: 2.0, 2: 1.5, 3: 1.0}
    facts, problems = judge([(1, 2.0), (2, 1.5 * (1 + 5e-5)), (3, 1.0)], ref, {1: 2, 2: 1, 3: 2}, nodes=2)
    assert problems == [] and facts["world_sizes"] == [2, 1, 2] and facts["losses_compared"] == 3
    _, problems = judge([(2, 1.5 * (1 + 3e-4))], ref, {1: 2, 2: 1}, nodes=2)
    assert any("did not grow back" in p for p in problems) and any("3.00e-04" in p for p in problems)
    _, problems = judge([], ref, {1: 2}, nodes=2)
    assert any("fewer than 2 nodes" in p for p in problems) and any("no step's loss" in p for p in problems)


def test_a_survivors_runs_are_split_into_the_attempts_it_served(tmp_path: Path) -> None:
    rows = [[1, 3.0], [2, 2.9], [3, 2.8], [3, 2.8], [4, 2.7], [5, 2.6], [5, 2.6], [6, 2.5]]  # 3 runs
    (tmp_path / "result.rank0.steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    li = SimpleNamespace(work_dir=tmp_path, instance=SimpleNamespace(instance_id="i-1"))
    twin = SimpleNamespace(compute=SimpleNamespace(instances=lambda: [li]))
    nodes = [_node(1, 0, "i-1"), _node(1, 1, "i-2"), _node(2, 0, "i-1"), _node(3, 0, "i-1"), _node(3, 1, "i-3"),
             _node(3, 2, "i-9", spare=True)]
    assert world_sizes(nodes) == {1: 2, 2: 1, 3: 2}
    assert losses_by_attempt(twin, nodes) == {1: {1: 3.0, 2: 2.9, 3: 2.8}, 2: {3: 2.8, 4: 2.7, 5: 2.6},  # type: ignore[arg-type]
                                               3: {5: 2.6, 6: 2.5}}


def test_runs_split_at_a_rollback_or_where_a_later_run_resumed() -> None:
    # a grow-back resumes right after the last save: no step goes back, the resumed event tells
    assert split_runs([0, 1, 2, 3, 4, 5], resumed=[3], runs=2) == [0, 0, 0, 1, 1, 1]
    # a rollback repeats steps: the second 3 starts the next run, the first belongs to the old one
    assert split_runs([0, 1, 2, 3, 4, 3, 4], resumed=[3], runs=2) == [0, 0, 0, 0, 0, 1, 1]
    assert split_runs([5, 6, 7, 8], resumed=[5, 7], runs=2) == [0, 0, 1, 1]  # both runs resumed
    assert split_runs([0, 1, 2], resumed=[], runs=1) == [0, 0, 0]
