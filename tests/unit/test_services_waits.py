"""The pure verdicts behind the workflow's task-token waits."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from spotrelay.contracts.workflow import MAX_WAIT_S, WorkflowTimings
from spotrelay.domain.models import Job, Node, NodeState, Pool
from spotrelay.domain.status import JobStatus
from spotrelay.services.recovery_flow import backoff_seconds
from spotrelay.services.waits import outcome_verdict, ready_verdict
from spotrelay.services.workflow_tasks import error_reason
from spotrelay.spec.models import JobSpec

POOL = Pool(region="us-east-1", az="us-east-1a", instance_type="p5.48xlarge", market="spot")
JOB = Job(job_id="j", name="j", status=JobStatus.RUNNING, attempt=1)


def gang(*states: tuple[NodeState, int | None]) -> list[Node]:
    return [
        Node(job_id="j", node_id=f"a1-r{r}", attempt=1, rank=r, instance_id=f"i-{r:x}", pool=POOL, state=s, exit_code=c)
        for r, (s, c) in enumerate(states)
    ]


def test_ready_needs_every_node() -> None:
    assert ready_verdict(JOB, []) is None
    assert ready_verdict(JOB, gang((NodeState.READY, None), (NodeState.PENDING, None))) is None
    assert ready_verdict(JOB, gang((NodeState.READY, None), (NodeState.READY, None))).outcome == "ready"  # type: ignore[union-attr]


def test_ready_fails_fast_when_a_node_goes_first() -> None:
    doomed = ready_verdict(JOB, gang((NodeState.READY, None), (NodeState.DOOMED, None)))
    assert doomed is not None and doomed.outcome == "interrupted" and doomed.lost_ranks == (1,)
    lost = ready_verdict(JOB, gang((NodeState.LOST, None), (NodeState.PENDING, None)))
    assert lost is not None and lost.outcome == "node-lost"


def test_outcome_waits_for_every_rank_after_a_notice() -> None:
    saving = gang((NodeState.DOOMED, None), (NodeState.EXITED, 75))
    assert outcome_verdict(JOB, saving) is None  # rank 0 is still saving
    done = gang((NodeState.TERMINATED, None), (NodeState.EXITED, 75))
    verdict = outcome_verdict(JOB, done)
    assert verdict is not None and verdict.outcome == "interrupted" and verdict.saved is True
    unsaved = outcome_verdict(JOB, gang((NodeState.EXITED, 76), (NodeState.EXITED, 75)))
    assert unsaved is not None and unsaved.saved is False


def test_outcome_ends_at_once_on_loss_user_or_infra_error() -> None:
    assert outcome_verdict(JOB, gang((NodeState.READY, None), (NodeState.LOST, None))).outcome == "node-lost"  # type: ignore[union-attr]
    user = outcome_verdict(JOB, gang((NodeState.READY, None), (NodeState.EXITED, 3)))
    assert user is not None and user.outcome == "user-error" and user.exit_code == 3
    infra = outcome_verdict(JOB, gang((NodeState.EXITED, 77), (NodeState.READY, None)))
    assert infra is not None and infra.outcome == "infra-error"


def test_a_user_error_on_a_higher_rank_beats_the_peers_infra_error() -> None:
    # rank 1 crashed in user code; rank 0's collective then failed and it reported 77
    verdict = outcome_verdict(JOB, gang((NodeState.EXITED, 77), (NodeState.EXITED, 1)))
    assert verdict is not None and verdict.outcome == "user-error" and verdict.rank == 1


def test_outcome_success_and_cancel() -> None:
    assert outcome_verdict(JOB, gang((NodeState.EXITED, 0), (NodeState.READY, None))) is None
    assert outcome_verdict(JOB, gang((NodeState.EXITED, 0), (NodeState.EXITED, 0))).outcome == "succeeded"  # type: ignore[union-attr]
    assert outcome_verdict(JOB, gang((NodeState.EXITED, 78), (NodeState.EXITED, 0))).outcome == "cancelled"  # type: ignore[union-attr]


def test_backoff_doubles_up_to_the_cap() -> None:
    t = WorkflowTimings(backoff_s=30, backoff_max_s=100)
    assert [backoff_seconds(t, n) for n in (1, 2, 3, 4)] == [30, 60, 100, 100]
    assert backoff_seconds(WorkflowTimings(backoff_s=0, backoff_max_s=0), 5) == 0


def test_no_wait_outlasts_an_execution(monkeypatch: pytest.MonkeyPatch) -> None:
    # a Standard execution ends within a year; Step Functions fails a Wait over 99,999,999 s at run
    # time, so a longer value is refused where it is read, naming its field
    assert WorkflowTimings(loss_settle_s=MAX_WAIT_S, outcome_timeout_s=MAX_WAIT_S).loss_settle_s == MAX_WAIT_S
    for field in ("loss_settle_s", "backoff_max_s", "outcome_timeout_s", "provision_retry_s", "heartbeat_s"):
        with pytest.raises(ValidationError, match=field):
            WorkflowTimings.model_validate({field: 100_000_000})
    monkeypatch.setenv("SPOTRELAY_WF_BACKOFF_S", str(MAX_WAIT_S + 1))
    with pytest.raises(ValidationError, match="backoff_s"):
        WorkflowTimings.from_env()


def test_error_reason_reads_the_lambda_cause() -> None:
    cause = '{"errorType": "RetryBudgetExhaustedError", "errorMessage": "recoveries spent (2 of max_recoveries=2)"}'
    assert error_reason({"Error": "RetryBudgetExhaustedError", "Cause": cause}) == (
        "RetryBudgetExhaustedError: recoveries spent (2 of max_recoveries=2)"
    )
    assert error_reason({"Error": "States.Timeout", "Cause": "plain"}) == "States.Timeout: plain"
    assert error_reason(None) == "failed"


def test_launch_at_notice_is_read_from_the_stored_spec_or_its_default() -> None:
    # a doomed rank with its reclaim time: with launch_at_notice the attempt ends at once with the deadline
    doc = {"version": 1, "name": "t", "entrypoint": {"script": "trainer.py"}, "resources": {"nodes": 2},
           "checkpoint": {"every_steps": 100}}
    full = JobSpec.model_validate(doc).model_dump(mode="json")  # what submit stores
    nodes = [n.model_copy(update={"reclaim_at": 500.0} if n.rank == 0 else {})
             for n in gang((NodeState.DOOMED, None), (NodeState.RUNNING, None))]
    for spec, ends in ((full, True), (doc, True),  # (the default: True)
                       ({**full, "recovery": {**full["recovery"], "launch_at_notice": False}}, False),
                       ({**doc, "recovery": {"launch_at_notice": False}}, False)):
        verdict = outcome_verdict(JOB.model_copy(update={"spec": spec}), nodes)
        assert (verdict is not None and verdict.deadline == 500.0 and verdict.saved is None) is ends, spec
        assert (verdict is None) is not ends
    # a stored value that is not a bool is validated, as before: the error names the field
    with pytest.raises(ValidationError, match="launch_at_notice"):
        outcome_verdict(JOB.model_copy(update={"spec": {**doc, "recovery": {"launch_at_notice": "maybe"}}}), nodes)
