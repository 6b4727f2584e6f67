"""The global batch plan and the global-cursor sampler: the data order does not depend on the world size."""

from __future__ import annotations

import pytest

from agent.batching import BatchPlan, GlobalBatchSampler
from spotrelay.errors import BatchPlanError


def _step_sets(size: int, world: int, micro: int, glob: int, epoch: int, cursor: int) -> list[set[int]]:
    """The samples each step of the rest of the epoch uses, all ranks together."""
    per_rank = []
    for rank in range(world):
        sampler = GlobalBatchSampler(size, BatchPlan(glob, micro, world, rank), seed=3)
        sampler.set_epoch(epoch)
        sampler.set_cursor(cursor)
        per_rank.append(list(sampler))
    accumulation = glob // (micro * world)
    steps = len(per_rank[0]) // accumulation
    return [
        {i for r in per_rank for batch in r[s * accumulation : (s + 1) * accumulation] for i in batch}
        for s in range(steps)
    ]


def test_accumulation_is_global_batch_over_micro_batch_times_world() -> None:
    assert BatchPlan(12, 2, 1).accumulation == 6
    assert BatchPlan(12, 2, 3).accumulation == 2


def test_a_world_that_cannot_divide_the_global_batch_is_refused_naming_the_numbers() -> None:
    with pytest.raises(BatchPlanError, match=r"global batch 12 cannot be split over 4 ranks of micro-batch 2"):
        BatchPlan(12, 2, 4)


def test_the_advice_only_offers_what_can_work() -> None:
    with pytest.raises(
        BatchPlanError, match=r"; use a micro-batch that divides 3 or run on a world size that divides 6$"
    ):
        BatchPlan(12, 2, 4)  # 4 ranks of micro-batch 1 or 3 would do
    # 3 ranks cannot share 8 samples whatever the micro-batch (the tiny example's 2-rank run on 3)
    with pytest.raises(
        BatchPlanError, match=r"; no micro-batch lets 3 ranks split it: run on a world size that divides 2$"
    ):
        BatchPlan(8, 4, 3)
    with pytest.raises(BatchPlanError, match=r"; use a micro-batch that divides 6$"):
        BatchPlan(12, 5, 2)


def test_every_world_size_walks_the_same_global_order_from_any_cursor() -> None:
    reference = _step_sets(48, 1, 2, 12, epoch=1, cursor=0)
    assert len(reference) == 4 and set().union(*reference) == set(range(48))  # each sample once per epoch
    for world in (2, 3, 6):
        assert _step_sets(48, world, 2, 12, epoch=1, cursor=0) == reference
        assert _step_sets(48, world, 2, 12, epoch=1, cursor=24) == reference[2:]  # resumed mid-epoch


def test_epochs_are_shuffled_differently_and_the_remainder_is_left_out() -> None:
    first, second = _step_sets(50, 2, 2, 12, 0, 0), _step_sets(50, 2, 2, 12, 1, 0)
    assert first != second
    assert len(first) == 4 and len(set().union(*first)) == 48  # 50 mod 12 samples wait for another epoch


def test_a_dataset_smaller_than_one_global_batch_is_refused() -> None:
    with pytest.raises(BatchPlanError, match="8 samples, fewer than one global batch of 12"):
        GlobalBatchSampler(8, BatchPlan(12, 2, 2))
