"""Measured and modeled downtime per fault (spotrelay/local/downtime.py, docs/local-twin.md)."""

from __future__ import annotations

import pytest

from spotrelay.local.downtime import FaultTimes, downtime

BOOT = 300.0


def test_a_replacement_launched_after_the_stop_pays_the_whole_modeled_boot() -> None:
    # notice at 100, 30 s twin window; training stopped at 125, launch at 127, booted at 130 (3 s
    # scaled boot), first step at 136
    t = FaultTimes("spot-notice", 100.0, 125.0, 136.0, launched_at=127.0, booted_at=130.0, window_s=30.0)
    d = downtime(t, BOOT)
    assert d is not None
    assert d.downtime_s == pytest.approx(11.0)
    assert d.downtime_modeled_s == pytest.approx(11.0 - 3.0 + BOOT)  # measured - boot here + modeled boot
    assert d.window_training_share == pytest.approx(25 / 30)
    assert d.window_training_share_modeled == pytest.approx(1 - 5 / 120)  # stop -> reclaim as measured


def test_a_replacement_booted_during_the_window_hides_only_the_overlap_the_model_allows() -> None:
    # launched 2 s after the notice: in the model it boots until 2 + 300 = 302 s after the notice,
    # while training runs until 25 + 90 = 115 s after it; then what followed here (rendezvous,
    # restore, first step: 6 s after both were ready)
    t = FaultTimes("spot-notice", 100.0, 125.0, 131.0, launched_at=102.0, booted_at=105.0, window_s=30.0)
    d = downtime(t, BOOT)
    assert d is not None and d.downtime_s == pytest.approx(6.0)
    assert d.downtime_modeled_s == pytest.approx((2 + BOOT) - (25 + 90) + 6.0)


def test_an_unannounced_loss_has_no_window_and_no_shift() -> None:
    t = FaultTimes("node-lost", 200.0, 200.0, 230.0, launched_at=215.0, booted_at=218.0)
    d = downtime(t, BOOT)
    assert d is not None and d.downtime_s == pytest.approx(30.0)
    assert d.downtime_modeled_s == pytest.approx(30.0 - 3.0 + BOOT)
    assert d.window_training_share is None and d.window_training_share_modeled is None


def test_without_a_new_node_the_modeled_downtime_is_the_measured_one() -> None:
    t = FaultTimes("spot-notice", 100.0, 125.0, 128.0, window_s=30.0)  # a spare or survivors only
    d = downtime(t, BOOT)
    assert d is not None and d.downtime_modeled_s == d.downtime_s == pytest.approx(3.0)


def test_nothing_to_report_until_training_resumed() -> None:
    assert downtime(FaultTimes("node-lost", 1.0, 1.0, None), BOOT) is None


def test_the_old_gangs_drain_overlaps_the_modeled_boot_only_as_measured() -> None:
    # notice at 100; replacement launched at 102, booted at 105, its agent ready at 106 and gated
    # until the old gang drained; training stopped at 125, the replacement started its training
    # command at 130 (5 s of final save and drain, measured), first step at 140
    t = FaultTimes("spot-notice", 100.0, 125.0, 140.0, launched_at=102.0, booted_at=105.0, window_s=30.0,
                   ready_at=106.0, started_at=130.0)
    d = downtime(t, BOOT)
    assert d is not None and d.downtime_s == pytest.approx(15.0)
    new_node = 2 + BOOT + 1 - (25 + 90)  # modeled boot, then its own 1 s of agent start-up
    assert d.downtime_modeled_s == pytest.approx(max(new_node, 5.0) + 10.0)
    # a drain longer than the new node's modeled path stays on it
    slow = FaultTimes("spot-notice", 100.0, 125.0, 340.0, launched_at=102.0, booted_at=105.0, window_s=30.0,
                      ready_at=106.0, started_at=330.0)
    d = downtime(slow, BOOT)
    assert d is not None and d.downtime_modeled_s == pytest.approx((330 - 125) + 10.0)


def test_an_unannounced_loss_with_agent_times_pays_boot_start_up_and_the_rest() -> None:
    t = FaultTimes("node-lost", 200.0, 200.0, 240.0, launched_at=215.0, booted_at=218.0,
                   ready_at=220.0, started_at=220.0)
    d = downtime(t, BOOT)
    assert d is not None and d.downtime_s == pytest.approx(40.0)
    assert d.downtime_modeled_s == pytest.approx(40.0 - 3.0 + BOOT)  # still measured - boot here + B


def test_the_modeled_parts_are_reported() -> None:
    t = FaultTimes("spot-notice", 100.0, 125.0, 140.0, launched_at=102.0, booted_at=105.0, window_s=30.0,
                   ready_at=106.0, started_at=130.0)
    d = downtime(t, BOOT)
    assert d is not None
    assert d.parts == pytest.approx({"new_node": 2 + BOOT + 1 - 115, "old_gang": 5.0, "restart": 10.0})
    spare = downtime(FaultTimes("spot-notice", 100.0, 125.0, 128.0, window_s=30.0), BOOT)
    assert spare is not None and spare.parts is None
