"""The typed recovery contract: the verdicts the services send are the ones the ASL routes on, and
the models that cross the workflow's steps read back what was written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from spotrelay.contracts.events import Directive, DirectiveKind, parse_directive
from spotrelay.contracts.recovery import AttemptEnd, RecoveryAction, RecoveryPlan, Verdict
from spotrelay.domain.models import Pool

ASL = Path(__file__).resolve().parents[2] / "functions" / "workflows" / "job_run.asl.json"
POOL = Pool(region="us-east-1", az="us-east-1a", instance_type="p5.48xlarge", market="spot")


def _states() -> dict[str, Any]:
    states: dict[str, Any] = json.loads(ASL.read_text())["States"]
    return states


def _verdicts_named_by_the_asl() -> set[str]:
    """Every StringEquals on $.outcome.outcome, and every verdict a Pass state writes there."""
    named: set[str] = set()
    for state in _states().values():
        for rule in state.get("Choices", []):
            if rule["Variable"] in ("$.plan.wait_s", "$.resume_at", "$.timings.max_hops", "$.hops.count"):
                continue  # Placed (the LaunchPlan), Entry and the hand-over checks (services/handover.py)
            assert rule["Variable"] == "$.outcome.outcome", rule
            named.add(rule["StringEquals"])
        if state["Type"] == "Pass" and state.get("ResultPath") == "$.outcome":
            named.add(state["Result"]["outcome"])
    return named


def test_every_asl_verdict_is_a_member_of_the_enum_and_vice_versa() -> None:
    assert _verdicts_named_by_the_asl() == {v.value for v in Verdict}


def test_timeout_pass_states_are_valid_attempt_ends() -> None:
    for state in _states().values():
        if state["Type"] == "Pass" and state.get("ResultPath") == "$.outcome":
            assert AttemptEnd.model_validate(state["Result"]).outcome.timed_out


def test_init_is_the_empty_recovery_plan() -> None:
    init = RecoveryPlan.model_validate(_states()["Init"]["Result"])
    assert init.action is RecoveryAction.NEW_CLUSTER and not init.keeps and init.keep_instance_ids == []


def test_recovery_plan_round_trips_and_rejects_unknown_fields() -> None:
    plan = RecoveryPlan(action=RecoveryAction.REPLACE_LOST, outcome=Verdict.INTERRUPTED, pool=POOL,
                        keep_instance_ids=["i-0"], launch_ranks=[1])
    assert RecoveryPlan.model_validate(json.loads(plan.model_dump_json())) == plan and plan.keeps
    with pytest.raises(ValidationError, match="pool_key"):
        RecoveryPlan.model_validate({"action": "new-cluster", "pool_key": "x"})
    with pytest.raises(ValidationError):
        RecoveryPlan.model_validate({"action": "keep-everything"})


def test_a_crash_echoing_vanished_peers_becomes_their_loss() -> None:
    crash = AttemptEnd(outcome=Verdict.INFRA_ERROR, attempt=2, reason="collective broke", exit_code=77, rank=0,
                       lost_ranks=(0,))
    loss = crash.as_loss([3])
    assert (loss.outcome, loss.lost_ranks, loss.exit_code, loss.attempt) == (Verdict.NODE_LOST, (0, 3), None, 2)


def test_restart_directive_is_a_model_the_agent_parses() -> None:
    raw = Directive.restart("job", 3, 1, 100.0, "replacement joined").model_dump(mode="json")
    parsed = parse_directive(raw)
    assert parsed.kind is DirectiveKind.RESTART and (parsed.attempt, parsed.rank) == (3, 1)
    with pytest.raises(ValidationError):
        parse_directive({**raw, "kind": "restart"})  # a near miss is refused, not string-matched


def test_one_reading_of_an_end_every_attempt_end_is_the_jobs_own_or_a_loss() -> None:
    """``gang_lost`` is the one classification the placement review's evidence and the elastic advice
    read (they once kept two lists that disagreed on infra-error and on a record without a reason)."""
    from spotrelay.contracts.recovery import gang_lost

    ends = {v for v in Verdict if v not in (Verdict.READY, Verdict.REBALANCE)}  # (those end no attempt)
    own = {v for v in ends if v.ended_by_the_job}
    assert own == {Verdict.MIGRATE, Verdict.SUCCEEDED, Verdict.CANCELLED, Verdict.USER_ERROR}
    assert {v for v in ends if gang_lost(v.value)} == ends - own  # infra-error among the losses
    assert gang_lost(None) and gang_lost("a-reason-from-a-later-release")  # never taken for the job's own
