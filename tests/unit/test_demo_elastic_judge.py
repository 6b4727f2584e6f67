"""The elastic demo's judgement of the losses: within 1e-4 of the reference up to the step where
uninterrupted runs on the full and the smallest gang part by rounding (1e-6); reported, not judged,
after. A gang that grows back only after the last step is a problem."""

from __future__ import annotations

from spotrelay.local.demo_elastic import judge

REF = {s: 4.0 - s / 100 for s in range(20)}
SIZES = {1: 2, 2: 1, 3: 2}


def _drift(losses: dict[int, float], from_step: int, rel: float) -> dict[int, float]:
    return {s: v * (1 + rel) if s >= from_step else v for s, v in losses.items()}


def test_a_resume_that_breaks_the_losses_before_the_numerics_part_is_a_problem() -> None:
    run = _drift(REF, 8, 1e-3)
    small = _drift(REF, 15, 1e-3)  # the world sizes' own numerics part only at step 15
    facts, problems = judge(sorted(run.items()), REF, SIZES, 2, small)
    assert facts["numerics_apart_at_step"] == 15 and facts["losses_compared"] == 15
    assert problems == ["a step's loss is 1.00e-03 (relative) off the reference; the target is 1e-04"]


def test_rounding_drift_where_the_uninterrupted_runs_part_too_is_reported_not_judged() -> None:
    run, small = _drift(REF, 12, 8e-4), _drift(REF, 12, 5e-4)
    facts, problems = judge(sorted(run.items()), REF, SIZES, 2, small)
    assert problems == []
    assert facts["numerics_apart_at_step"] == 12 and facts["loss_max_rel_diff"] == 0.0
    assert facts["loss_max_rel_diff_all_steps"] > 7e-4 and facts["straight_runs_max_rel_diff"] > 4e-4


def test_without_the_small_reference_every_step_is_judged() -> None:
    facts, problems = judge(sorted(_drift(REF, 12, 8e-4).items()), REF, {1: 2, 2: 2}, 2)
    assert facts["numerics_apart_at_step"] is None and facts["losses_compared"] == 20
    assert len(problems) == 2 and problems[0].startswith("no attempt trained on fewer than 2 nodes")


def test_a_grown_gang_that_trained_no_step_is_a_problem() -> None:
    _, problems = judge(sorted(REF.items()), REF, SIZES, 2, last_trained=0)
    assert problems == ["the gang grew back to 2 nodes only after the last step (it trained no step)"]
    assert judge(sorted(REF.items()), REF, SIZES, 2, last_trained=5)[1] == []
