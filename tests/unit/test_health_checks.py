"""The health monitor's verdicts from reduced values, without torch.distributed (one rank, or the
MAX-reduced vector several ranks would share)."""

from __future__ import annotations

from agent.health import MILLI, HealthMonitor, robust_z
from spotrelay.contracts.health import AnomalyKind, HealthAction, HealthPolicy


def _healthy_steps(monitor: HealthMonitor, count: int, loss: float = 2.0, norm: float = 1.0) -> None:
    for step in range(1, count + 1):
        monitor.record(loss + 0.01 * (step % 3), norm + 0.01 * (step % 2))
        assert monitor.judge(step, tuple(monitor.extra(step))) is None


def test_robust_z_rises_only_for_spikes_and_needs_history() -> None:
    history = [2.0, 2.1, 1.9, 2.0, 2.05, 1.95]
    assert robust_z(9.0, history) > 50 and robust_z(1.0, history) == 0.0 and robust_z(9.0, history[:3]) == 0.0


def test_nan_loss_is_found_at_its_own_step_even_in_warmup() -> None:
    monitor = HealthMonitor(HealthPolicy(warmup_steps=100), rank=0, world_size=1)
    _healthy_steps(monitor, 3)
    monitor.record(float("nan"), 1.0)
    finding = monitor.judge(4, tuple(monitor.extra(4)))
    assert finding is not None and finding.kind is AnomalyKind.NON_FINITE and finding.step == 4
    assert finding.action is HealthAction.ROLLBACK


def test_loss_spike_and_grad_explosion_after_warmup_and_history_keeps_only_healthy_steps() -> None:
    policy = HealthPolicy(warmup_steps=5, actions={AnomalyKind.GRAD_EXPLOSION: HealthAction.STOP})
    monitor = HealthMonitor(policy, rank=0, world_size=1)
    _healthy_steps(monitor, 20)
    monitor.record(50.0, 1.0)
    spike = monitor.judge(21, tuple(monitor.extra(21)))
    assert spike is not None and spike.kind is AnomalyKind.LOSS_SPIKE and spike.value is not None
    assert all(v < 3 for _, v in monitor.losses)  # the spike did not enter the history
    monitor.record(2.0, 100.0)
    boom = monitor.judge(22, tuple(monitor.extra(22)))
    assert boom is not None and boom.kind is AnomalyKind.GRAD_EXPLOSION and boom.action is HealthAction.STOP
    monitor.forget_after(10)
    assert max(s for s, _ in monitor.losses) == 10


def test_a_resumed_process_warms_up_on_its_own_history_before_judging_a_spike() -> None:
    """After a resume at step 128 the history starts empty: 5 fresh losses must not judge a spike (a
    false one rolled back and skipped data after a resize, so the sample order left the reference's)."""
    monitor = HealthMonitor(HealthPolicy(warmup_steps=10), rank=0, world_size=1)
    for i, step in enumerate(range(129, 134)):
        monitor.record(2.0 + 0.01 * (i % 3), 1.0)
        assert monitor.judge(step, tuple(monitor.extra(step))) is None
    monitor.record(2.2, 1.0)  # a z-score of ~13 over 5 losses: judged, it would be a (false) spike
    assert monitor.judge(134, tuple(monitor.extra(134))) is None
    for i, step in enumerate(range(135, 140)):
        monitor.record(2.0 + 0.01 * (i % 3), 1.0)
        assert monitor.judge(step, tuple(monitor.extra(step))) is None
    monitor.record(50.0, 1.0)  # warm now, with its own history: a real spike is found
    spike = monitor.judge(140, tuple(monitor.extra(140)))
    assert spike is not None and spike.kind is AnomalyKind.LOSS_SPIKE


def test_any_rank_flag_is_everyones_finding() -> None:
    """What rank 1 flagged arrives at rank 0 through the MAX: rank 0 reaches the same verdict."""
    rank0 = HealthMonitor(HealthPolicy(), rank=0, world_size=2)
    rank0.record(2.0, 1.0)
    mine = rank0.extra(1)
    reduced = (1, *mine[1:])  # rank 1 saw an Inf
    finding = rank0.judge(1, reduced)
    assert finding is not None and finding.kind is AnomalyKind.NON_FINITE


def test_straggler_needs_consecutive_slow_comparisons_and_names_its_node() -> None:
    policy = HealthPolicy(warmup_steps=0, straggler_every=2, straggler_checks=2, straggler_factor=1.5)
    monitor = HealthMonitor(policy, rank=0, world_size=4, local_world_size=2)
    flags = [0, 0, 0]
    times = [100_000, 105_000, 300_000, 98_000]  # microseconds: rank 2 is three times slower
    assert monitor.judge(2, (*flags, *times)) is None  # first slow comparison
    finding = monitor.judge(4, (*flags, *times))
    assert finding is not None and finding.kind is AnomalyKind.STRAGGLER
    assert (finding.rank, finding.node_rank, finding.action) == (2, 1, HealthAction.REPLACE_NODE)
    assert finding.value is not None and finding.value > 2.5
    assert monitor.judge(6, (*flags, 10_000, 10_000, 10_500, 9_900)) is None


def test_millisecond_jitter_is_not_a_straggler() -> None:
    policy = HealthPolicy(warmup_steps=0, straggler_every=2, straggler_checks=1, straggler_min_s=0.05)
    monitor = HealthMonitor(policy, rank=0, world_size=2)
    assert monitor.judge(2, (0, 0, 0, 2_000, 6_000)) is None  # 3x slower, but by 4 ms
    found = monitor.judge(4, (0, 0, 0, 2_000, 80_000))
    assert found is not None and found.rank == 1


def test_straggler_times_ride_only_on_comparison_steps() -> None:
    monitor = HealthMonitor(HealthPolicy(warmup_steps=0, straggler_every=5), rank=1, world_size=3)
    assert len(monitor.extra(4)) == 3
    values = monitor.extra(5)
    assert len(values) == 6 and values[3] == values[5] == 0 and values[4] > 0
    assert MILLI == 1000
