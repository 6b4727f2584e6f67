"""Where paid GPU-hours go (sim/losses.py): each phase of a node's billed life, on a market small
enough to count by hand (4 p5 nodes, a 300 s boot, two of them reclaimed at 2 h)."""

from __future__ import annotations

import pytest

from spotrelay.sim.losses import CATEGORIES, shares
from spotrelay.sim.runner import measure
from tests.unit.test_sim_engine import job, market, run


def test_an_uninterrupted_run_pays_one_boot_and_one_restore() -> None:
    r = run("price-limit", 4, market())
    got = shares(r)
    assert set(got) == set(CATEGORIES) and sum(got.values()) == pytest.approx(1.0)
    life = r.paid_gpu_s / (4 * 8)  # seconds each node was billed (p5: speed 1)
    assert got["boot"] == pytest.approx(300.0 / life)
    assert got["restore"] == pytest.approx(job(4).restore_s() / life)
    assert got["useful"] == pytest.approx(measure("price-limit", 0, r).values["goodput"])
    assert got["checkpoint_stall"] > 0  # the periodic snapshot's stall, spread over the steps
    assert got["lost_work"] == pytest.approx(0.0, abs=1e-9) and got["never_trained"] == got["spare"] == 0.0


def test_a_reclaim_without_a_save_is_lost_work_and_a_second_boot() -> None:
    calm, hit = shares(run("sagemaker-like", 2, market())), run("sagemaker-like", 4, market())
    got = shares(hit)
    assert sum(got.values()) == pytest.approx(1.0)
    # back to the last periodic checkpoint: the steps trained since are paid and redone (steps_lost
    # counts whole steps; the step in progress at the reclaim is lost too)
    step_paid = job(4).step_s("p5.48xlarge") * 4 * 8
    assert hit.metrics.steps_lost > 0
    assert got["lost_work"] * hit.paid_gpu_s == pytest.approx((hit.metrics.steps_lost + 0.5) * step_paid,
                                                              abs=0.5 * step_paid)
    assert got["boot"] > calm["boot"]  # the whole gang booted again once the pool was back
    assert got["useful"] == pytest.approx(measure("sagemaker-like", 0, hit).values["goodput"])
