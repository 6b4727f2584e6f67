"""Training through a spot notice: the flush-time predictor and when the final save must start.

Pure: every time is passed in (an injected clock), nothing sleeps.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import pytest

from agent.notice_window import (
    MB,
    FlushPredictor,
    FlushSample,
    Margin,
    NoticeTraining,
    NoticeWindow,
    StepTimer,
    final_save_due,
    with_inflight,
)


def test_predictor_without_samples_uses_the_prior_bandwidth_and_overhead() -> None:
    p = FlushPredictor(prior_mb_s=50, prior_overhead_s=1.0)
    assert p.predict(100 * MB) == pytest.approx(3.0)
    assert p.predict(0) == pytest.approx(1.0)


def test_predictor_scales_recent_saves_to_the_size_asked_and_takes_the_slowest() -> None:
    p = FlushPredictor(keep=2)
    p.observe(FlushSample(nbytes=100 * MB, seconds=9.0, emergency=True))  # old: pushed out by keep=2
    p.observe(FlushSample(nbytes=100 * MB, seconds=2.0, emergency=True))
    p.observe(FlushSample(nbytes=50 * MB, seconds=1.5, emergency=True))
    # 2.0 s for 100 MB and 1.5 s for 50 MB (= 3.0 s for 100 MB): the slower rate wins
    assert p.predict(100 * MB) == pytest.approx(3.0)
    assert p.predict(200 * MB) == pytest.approx(6.0)


def test_predictor_prefers_the_emergency_lane_once_it_has_timed_one() -> None:
    p = FlushPredictor()
    p.observe(FlushSample(nbytes=10 * MB, seconds=4.0, emergency=False))  # 2 connections, nice 15
    assert p.predict(10 * MB) == pytest.approx(4.0)  # only the periodic lane so far: err early
    p.observe(FlushSample(nbytes=10 * MB, seconds=1.0, emergency=True))
    assert p.predict(10 * MB) == pytest.approx(1.0)


def test_predictor_ignores_empty_samples_and_rejects_bad_settings() -> None:
    p = FlushPredictor(prior_mb_s=100, prior_overhead_s=0.5)
    p.observe(FlushSample(nbytes=10 * MB, seconds=0.0, emergency=True))
    assert p.samples == [] and p.predict(100 * MB) == pytest.approx(1.5)
    with pytest.raises(ValueError, match="prior_mb_s"):
        FlushPredictor(prior_mb_s=0)


def test_step_timer_reports_the_slowest_recent_step() -> None:
    t = StepTimer(keep=3)
    assert t.estimate() == 0.0
    for now in (100.0, 100.5, 101.5, 101.8, 102.0, 102.2):
        t.tick(now)
    assert t.estimate() == pytest.approx(0.3)  # the 1.0 s step fell out of the last three
    t.tick(50.0)  # a clock that went back adds nothing
    assert t.estimate() == pytest.approx(0.3)


def test_final_save_is_due_when_one_more_step_would_not_leave_room() -> None:
    deadline = 1000.0
    # step 0.5 + flush 4 + margin 3 = 7.5 s needed after this boundary
    assert not final_save_due(992.0, deadline, step_s=0.5, flush_s=4.0, pending_s=0.0, margin_s=3.0)
    assert final_save_due(992.5, deadline, step_s=0.5, flush_s=4.0, pending_s=0.0, margin_s=3.0)
    # the notice snapshot still uploading: the final save queues behind it
    assert final_save_due(990.0, deadline, step_s=0.5, flush_s=4.0, pending_s=3.0, margin_s=3.0)


def test_margin_grows_with_the_predicted_flush() -> None:
    m = Margin(fixed_s=2.0, share=0.5)
    assert m.of(0.0) == 2.0 and m.of(4.0) == 4.0


def test_an_inflight_snapshot_delays_the_final_save_and_stretches_its_prediction() -> None:
    assert with_inflight(4.0, None) == (4.0, 0.0)  # committed: nothing to queue behind
    assert with_inflight(4.0, 1.0) == pytest.approx((4.0, 3.0))
    # running for 10 s against a 4 s prediction: the final save (same size, same lane) takes >= 10 s,
    # and the snapshot still needs a quarter of that, not nothing
    assert with_inflight(4.0, 10.0) == pytest.approx((10.0, 2.5))


def test_a_window_walk_through_with_an_injected_clock() -> None:
    """120 s window, 1 s steps, saves of 200 MB that took 2.5 s: training until the last boundary
    that leaves step + flush + margin, i.e. about 93% of the window."""
    notice_at, deadline = 5000.0, 5120.0
    p = FlushPredictor()
    p.observe(FlushSample(nbytes=200 * MB, seconds=2.5, emergency=False))
    timer, margin = StepTimer(), Margin()
    window = NoticeWindow(deadline=deadline, notice_at=notice_at, notice_step=40, request_id="r1")
    now, step = notice_at, 40
    snapshot_done_at = notice_at + 2.0
    while True:
        timer.tick(now)
        flush, pending = with_inflight(p.predict(200 * MB), None if now >= snapshot_done_at else now - notice_at)
        if final_save_due(now, window.deadline, timer.estimate(), flush, pending, margin.of(flush)):
            break
        now, step = now + 1.0, step + 1
    assert now + flush + margin.of(flush) <= deadline  # the final save fits
    assert now + 1.0 + flush + margin.of(flush) > deadline - 1.0  # and is not taken much earlier
    assert (now - notice_at) / (deadline - notice_at) > 0.9
    window.tighten(deadline - 60)  # another node's notice with an earlier reclaim
    window.tighten(None)
    window.tighten(deadline)
    assert window.deadline == deadline - 60


@dataclass
class FakeSave:
    started: float
    nbytes: int = 0
    emergency: bool = True
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)
    flush_s: float = 0.0


def test_the_tracker_learns_from_finished_saves_and_waits_for_the_snapshot() -> None:
    """A rank's view: a periodic save taught it 4 s; the notice snapshot is in flight, then done in 2 s."""
    tracker = NoticeTraining(Margin(fixed_s=1.0, share=0.0))
    periodic = FakeSave(started=0.0, nbytes=10 * MB, emergency=False, flush_s=4.0)
    tracker.saved(periodic)
    tracker.boundary(1.0)
    assert tracker.flush.predict(10 * MB) == pytest.approx(1.1)  # not finished: the prior (1 s + 10 MB at 100 MB/s)
    periodic.done.set()
    for now in (2.0, 3.0):
        tracker.boundary(now)
    assert tracker.save_bytes == 10 * MB and tracker.flush.predict(10 * MB) == pytest.approx(4.0)
    deadline = 30.0
    assert not tracker.no_room(3.0, deadline)  # 3 + 1 (step) + 4 + 4 + 1 = 13 < 30
    assert tracker.no_room(20.5, deadline)  # 20.5 + 10 > 30: the snapshot is the last save
    snapshot = FakeSave(started=3.0, nbytes=10 * MB, flush_s=2.0)
    tracker.saved(snapshot)
    tracker.open(deadline, 3.0, 40, "r1", snapshot)
    # in flight for 1 s of a predicted 4: the final save queues 3 s behind it, then takes 4
    assert tracker.final_due(4.0) is False
    late = NoticeTraining(Margin(fixed_s=1.0, share=0.0))
    late.open(deadline, 3.0, 40, "r1", FakeSave(started=3.0, nbytes=10 * MB))
    assert late.final_due(17.0)  # 14 s in flight: the final save takes >= 14 s and waits 3.5 s
    due_at = None
    for now in range(4, 31):
        if now == 6:
            snapshot.done.set()  # committed: the tracker learns 2 s on the emergency lane
        tracker.boundary(float(now))
        if tracker.final_due(float(now)):
            due_at = now
            break
    assert tracker.flush.predict(10 * MB) == pytest.approx(2.0)
    assert due_at == 26  # 26 + 1 (step) + 2 (flush) + 1 (margin) = 30: the last boundary that fits
    assert NoticeTraining(Margin()).final_due(0.0) is False  # no window, nothing due
