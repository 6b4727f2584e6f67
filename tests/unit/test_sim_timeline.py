"""sim/timeline.py: a run's notes become boot and training bars per pool, and loss marks."""

from __future__ import annotations

from itertools import pairwise

from spotrelay.sim.build import MarketOptions
from spotrelay.sim.job import JobModel
from spotrelay.sim.runner import SimOptions, run_seed
from spotrelay.sim.timeline import BOOT, TRAIN, bars

A, B = "us-east-1/us-east-1a/p5.48xlarge/spot", "us-west-2/us-west-2a/p5.48xlarge/spot"


def test_a_notice_then_a_gang_elsewhere_that_trains_then_a_move_back() -> None:
    drawn = bars([
        (0.0, A, "launch 16 (spot) attempt 1"),
        (400.0, A, "training from step 0"),
        (1000.0, A, "notice rank 3"),
        (1000.0, A, "recover: interrupted, new-cluster"),
        (1000.0, B, "launch 16 (spot) attempt 2"),  # launched at the notice
        (1450.0, B, "training from step 40"),
        (5000.0, A, "launch 16 (spot) attempt 3"),
        (5000.0, A, "move x16 (review: ...)"),  # make-before-break: B trains while A boots
        (5400.0, A, "training from step 300"),
        (9000.0, "", "finished"),
    ])
    assert drawn.pools() == [A, B]
    assert drawn.spans[A] == [(0.0, 400.0, BOOT), (400.0, 1000.0, TRAIN), (5000.0, 5400.0, BOOT),
                              (5400.0, 9000.0, TRAIN)]
    assert drawn.spans[B] == [(1000.0, 1450.0, BOOT), (1450.0, 5400.0, TRAIN)]
    assert drawn.losses == [(1000.0, A)]
    assert drawn.end == 9000.0


def test_an_unannounced_loss_while_booting_ends_the_gang_and_is_marked() -> None:
    drawn = bars([
        (0.0, A, "launch 16 (spot) attempt 1"),
        (200.0, A, "recover: node-lost, new-cluster"),
        (800.0, B, "launch 16 (on-demand) attempt 2"),
    ])
    assert drawn.spans[A] == [(0.0, 200.0, BOOT)]
    assert drawn.spans[B] == []  # still booting when the notes end: nothing to draw yet
    assert drawn.losses == [(200.0, A)]


def test_a_simulated_run_trains_about_as_long_as_its_useful_hours_say() -> None:
    opts = SimOptions(market=MarketOptions(traces=["spotrelay/local/data/bamboo-g4dn-trace.csv"]),
                      job=JobModel(nodes=8, job_hours=24.0), policies=("spotrelay",), timeline=True)
    run = run_seed(opts, 0)[0]
    drawn = bars(run.timeline)
    trained_h = sum(b - a for spans in drawn.spans.values() for a, b, phase in spans if phase == TRAIN) / 3600
    useful_h = run.values["useful_gpu_hours"] / (8 * 8)  # 8 nodes of 8 GPUs
    assert trained_h >= useful_h * 0.95  # (the bars also hold work later redone, and each last save's minutes)
    assert trained_h <= run.values["wall_hours"]
    for spans in drawn.spans.values():
        assert all(a < b for a, b, _ in spans)
        assert all(b1 <= a2 for (_, b1, _), (a2, _, _) in pairwise(spans))  # one gang per pool at a time
