"""``checkpoint.every_minutes: auto``: Young's optimum from the market (controller) and the save's
stall (trainer); the spec field, placement's score under it and the simulator's trainers."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from spotrelay.domain.cadence import auto_interval_s, loss_interval_s, trainer_interval_s
from spotrelay.placement import PoolStats, rank_pools
from spotrelay.placement.policy import DEFAULT_CONFIG, checkpoint_hours, loss_interval
from spotrelay.sim.job import JobModel
from spotrelay.spec.models import Checkpoint, JobSpec
from tests.unit.test_placement_policy import NOW, quotes_for


def _spec(**checkpoint: Any) -> JobSpec:
    return JobSpec.model_validate({
        "version": 1, "name": "llm", "entrypoint": {"command": ["python", "train.py"]},
        "resources": {"nodes": 16, "regions": ["us-east-1"]}, "checkpoint": checkpoint})


def test_young_optimum_within_the_bounds() -> None:
    # 1 s stall, a loss every 5,000 s: sqrt(2 x 1 x 5000) = 100 s
    assert auto_interval_s(1.0, 5000.0, 10.0, 3600.0) == pytest.approx(100.0)
    assert auto_interval_s(1.0, 5000.0, 300.0, 3600.0) == 300.0  # the floor
    assert auto_interval_s(100.0, 1e6, 60.0, 3600.0) == 3600.0  # the ceiling
    assert auto_interval_s(1.0, None, 60.0, 3600.0) == 3600.0  # no loss expected: the ceiling
    assert auto_interval_s(1.0, 5000.0, 4000.0, 3600.0) == 4000.0  # an upload slower than the ceiling


def test_loss_interval_counts_only_losses_without_a_notice() -> None:
    assert loss_interval_s(2.0, 0.1) == pytest.approx(3600.0 / 0.2)
    assert loss_interval_s(2.0, 0.0) is None and loss_interval_s(0.0, 0.1) is None
    # the trainer's floor is one upload of its checkpoint
    assert trainer_interval_s(0.01, 400.0, 1000.0, 120.0, 3600.0) == 400.0


def test_notices_the_ranks_could_not_save_in_count_as_losses() -> None:
    """A 2-node gang of the stated job flushes each node's half in ~135 s against the 120 s notice:
    its reclaims redo the work since the last periodic save like unannounced ones do, so the auto
    cadence reads the job's own notices (the agent's deadline-at-risk on each attempt)."""
    from spotrelay.domain.advice import notice_risk_share
    from spotrelay.domain.cadence import work_losing_share
    from spotrelay.domain.models import Attempt

    assert work_losing_share(0.1, 0.0) == 0.1 and work_losing_share(0.1, 1.0) == 1.0
    assert work_losing_share(0.1, 0.5) == pytest.approx(0.55)
    assert work_losing_share(0.1, 7.0) == 1.0 and work_losing_share(0.1, -1.0) == 0.1  # (a share)
    noticed = [Attempt(number=i + 1, end_reason="interrupted", notice_at_risk=i % 2 == 0) for i in range(4)]
    others = [Attempt(number=5, end_reason="node-lost", notice_at_risk=True), Attempt(number=6)]
    assert notice_risk_share(noticed + others) == 0.5  # of the noticed gangs only
    assert notice_risk_share(others) == 0.0 and notice_risk_share([]) == 0.0  # no notice yet: no evidence
    spec = _spec(every_minutes="auto")
    scored = rank_pools(spec, [next(x for x in quotes_for(spec) if x.pool.market == "spot")], {}, NOW)[0]
    calm, at_risk = loss_interval(scored), loss_interval(scored, at_risk=1.0)
    assert calm is not None and at_risk is not None
    assert at_risk == pytest.approx(calm * DEFAULT_CONFIG.unannounced_share)  # every reclaim loses work
    assert trainer_interval_s(5.0, 0.0, at_risk, 60.0, 3600.0) < trainer_interval_s(5.0, 0.0, calm, 60.0, 3600.0)


@given(st.floats(0.0, 600.0), st.floats(1.0, 1e7), st.floats(1.0, 1e7))
def test_a_stormier_market_never_checkpoints_less_often(stall: float, a: float, b: float) -> None:
    short, long_ = sorted((a, b))
    assert trainer_interval_s(stall, 0.0, short, 60.0, 3600.0) <= trainer_interval_s(stall, 0.0, long_, 60.0, 3600.0)
    assert 60.0 <= trainer_interval_s(stall, 0.0, short, 60.0, 3600.0) <= 3600.0


def test_spec_takes_auto_or_minutes_and_names_the_field() -> None:
    assert Checkpoint(every_minutes="auto").auto and Checkpoint(every_minutes="auto").fixed_minutes is None
    assert Checkpoint(every_minutes="7.5").fixed_minutes == 7.5  # (a quoted number, as before)
    for bad in ("never", -3, 0, True, float("nan"), float("inf")):
        with pytest.raises(ValidationError, match="minutes above 0, or 'auto'") as err:
            Checkpoint(every_minutes=bad)
        assert len(err.value.errors()) == 1  # one message, not one per branch of the union
    # no cadence stated: the market's; steps alone stay steps alone
    assert Checkpoint().auto and Checkpoint(every_minutes=None).auto
    assert Checkpoint(every_steps=100).every_minutes is None
    with pytest.raises(ValidationError, match="auto_min_minutes is above auto_max_minutes"):
        Checkpoint(every_minutes="auto", auto_min_minutes=30, auto_max_minutes=10)


def test_placement_prices_the_cadence_auto_will_keep() -> None:
    spec, fixed = _spec(every_minutes="auto"), _spec(every_minutes=60)
    q = next(x for x in quotes_for(spec) if x.pool.market == "spot")
    stormy = {q.pool.key: PoolStats(pool_key=q.pool.key, interruptions=500, hours_observed=1000.0)}
    calm = {q.pool.key: PoolStats(pool_key=q.pool.key, hours_observed=100_000.0)}
    auto_stormy, auto_calm = (rank_pools(spec, [q], s, NOW)[0] for s in (stormy, calm))
    gang_rate = auto_stormy.breakdown["gang_interruptions_per_hour"]
    assert checkpoint_hours(spec, DEFAULT_CONFIG, gang_rate) < checkpoint_hours(
        spec, DEFAULT_CONFIG, auto_calm.breakdown["gang_interruptions_per_hour"]) <= 1.0
    # a shorter interval loses less work per loss: the stormy pool scores better under auto than at 60 min
    assert auto_stormy.score < rank_pools(fixed, [q], stormy, NOW)[0].score
    # the attempt record's loss interval is the scored gang's
    assert loss_interval(auto_stormy) == pytest.approx(3600.0 / (gang_rate * DEFAULT_CONFIG.unannounced_share))


def test_the_simulated_trainers_choose_as_the_agent_does() -> None:
    job = JobModel(nodes=16)
    auto = Checkpoint(every_minutes="auto")
    step_s, stall = job.step_s("p5.48xlarge"), job.stall_s("p5.48xlarge")
    stormy = job.spec_every_steps(auto, "p5.48xlarge", 3600.0)
    calm = job.spec_every_steps(auto, "p5.48xlarge", 100 * 3600.0)
    assert stormy < calm <= round(3600.0 / step_s)
    expected = max(2 * 60.0, job.persist_s(), math.sqrt(2 * stall * 3600.0))
    assert stormy == max(1, round(expected / step_s))
    assert job.spec_every_steps(auto, "p5.48xlarge", None) == round(3600.0 / step_s)  # the ceiling
    # a fixed cadence is the spec's, and every_steps caps either
    assert job.spec_every_steps(Checkpoint(every_minutes=30), "p5.48xlarge", 60.0) == job.every_steps("p5.48xlarge")
    assert job.spec_every_steps(Checkpoint(every_minutes="auto", every_steps=3), "p5.48xlarge", None) == 3


def test_auto_loses_fewer_steps_than_half_hourly_saves_on_the_g4dn_trace() -> None:
    from spotrelay.sim.build import MarketOptions
    from spotrelay.sim.runner import SimOptions, simulate

    def lost(**switches: Any) -> tuple[float, float]:
        opts = SimOptions(market=MarketOptions(traces=["spotrelay/local/data/bamboo-g4dn-trace.csv"]),
                          job=JobModel(nodes=16, job_hours=72.0), policies=("spotrelay",), seeds=2,
                          spotrelay_switches=switches)
        report = simulate(opts)
        return report.mean("spotrelay", "steps_lost"), report.mean("spotrelay", "useful_gpu_hours")

    (fixed, useful), (auto, useful_auto) = lost(), lost(every_minutes="auto")
    assert auto < fixed and useful_auto == pytest.approx(useful)  # the same model, less redone work
