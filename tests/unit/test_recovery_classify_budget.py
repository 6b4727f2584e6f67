"""How attempts end and whether the retry budget allows another."""

from __future__ import annotations

import pytest

from spotrelay.domain.models import Node, NodeState, Pool
from spotrelay.errors import RetryBudgetExhaustedError
from spotrelay.recovery import Charge, Verdict, check_retry_budget, classify_attempt, classify_nodes, stall
from spotrelay.spec.models import Recovery

POOL = Pool(region="us-east-1", az="us-east-1a", instance_type="p5.48xlarge", market="spot")


@pytest.mark.parametrize(
    ("codes", "doomed", "lost", "kind", "gone"),
    [
        ({0: 0, 1: 0}, [], [], Verdict.SUCCEEDED, ()),
        ({0: 0, 1: 0}, [1], [], Verdict.SUCCEEDED, ()),  # doomed after its rank finished: nothing to resume
        ({0: 0}, [1], [], Verdict.INTERRUPTED, (1,)),  # the doomed rank has not said it finished
        ({0: 75, 1: 75}, [1], [], Verdict.INTERRUPTED, (1,)),
        ({0: 75}, [], [], Verdict.INTERRUPTED, ()),  # the IMDS path alone
        ({0: 77}, [], [1], Verdict.NODE_LOST, (1,)),  # survivors see a broken collective
        ({0: 1, 1: 77}, [], [], Verdict.USER_ERROR, ()),  # user code is the root cause
        ({0: 0, 1: 3}, [], [], Verdict.USER_ERROR, ()),
        ({0: 77, 1: 0}, [], [], Verdict.INFRA_ERROR, (0,)),
        ({0: -9}, [], [], Verdict.INFRA_ERROR, (0,)),
        ({0: 78, 1: 75}, [1], [], Verdict.CANCELLED, (1,)),
    ],
)
def test_classify_attempt(codes: dict[int, int], doomed: list[int], lost: list[int], kind: Verdict,
                          gone: tuple[int, ...]) -> None:
    outcome = classify_attempt(codes, doomed, lost)
    assert outcome.outcome is kind
    assert outcome.lost_ranks == gone


def test_classify_names_the_deciding_rank_and_code() -> None:
    out = classify_attempt({0: 77, 1: 0, 2: 13, 3: 1})
    assert (out.outcome, out.rank, out.exit_code) == (Verdict.USER_ERROR, 2, 13)
    assert "exited 13 on rank 2" in out.reason
    unsaved = classify_attempt({0: 76, 1: 76}, doomed_ranks=[0])
    assert "missed the deadline" in unsaved.reason
    with pytest.raises(ValueError):
        classify_attempt({})


def test_classify_from_node_records() -> None:
    def node(rank: int, state: NodeState, code: int | None = None) -> Node:
        return Node(job_id="j", node_id=f"a1-r{rank}", attempt=1, rank=rank, instance_id=f"i-{rank}", pool=POOL,
                    state=state, exit_code=code)

    out = classify_nodes([node(0, NodeState.EXITED, 77), node(1, NodeState.LOST), node(2, NodeState.RUNNING)])
    assert out.outcome is Verdict.NODE_LOST and out.lost_ranks == (1,)
    assert classify_nodes([node(0, NodeState.RUNNING)], cancelled=True).outcome is Verdict.CANCELLED


def test_a_doomed_node_that_exited_after_saving_is_still_leaving() -> None:
    """The exit event turns DOOMED into EXITED; its reclaim time keeps it out of the survivors."""
    def node(rank: int, reclaim_at: float | None) -> Node:
        return Node(job_id="j", node_id=f"a1-r{rank}", attempt=1, rank=rank, instance_id=f"i-{rank}", pool=POOL,
                    state=NodeState.EXITED, exit_code=75, reclaim_at=reclaim_at)

    out = classify_nodes([node(0, None), node(1, 1000.0)])
    assert out.outcome is Verdict.INTERRUPTED and out.lost_ranks == (1,)  # rank 1 is replaced, rank 0 stays


def test_recoveries_are_charged_until_the_budget_is_spent() -> None:
    policy = Recovery(max_recoveries=2)
    outcome = classify_attempt({0: 75}, doomed_ranks=[0])
    d = check_retry_budget(policy, outcome, recoveries_used=1, user_restarts_used=0)
    assert (d.charge, d.recoveries, d.user_restarts) == (Charge.RECOVERY, 2, 0)
    with pytest.raises(RetryBudgetExhaustedError, match=r"recoveries spent \(2 of max_recoveries=2\)"):
        check_retry_budget(policy, outcome, recoveries_used=2, user_restarts_used=0)


def test_a_job_that_keeps_saving_recovers_without_a_lifetime_cap() -> None:
    """The default has no lifetime cap: a long job on spot meets hundreds of interruptions, each after
    saving its work. What stops a job is ``max_stalled_recoveries`` in a row with no newer checkpoint
    committed in between (``stall``: counted from the newest commit at the recovery before, so a
    notice's final save, which commits after the recovery it started, counts)."""
    policy, notice = Recovery(), classify_attempt({0: 75}, doomed_ranks=[0])
    assert policy.max_recoveries is None and policy.max_stalled_recoveries == 10
    stalled, progress, step = 0, 0, 0
    for n in range(5000):  # a checkpoint newer than the last recovery's every time: never fails
        step += 10
        stalled, progress = stall(stalled, progress, step)
        d = check_retry_budget(policy, notice, n, 0, stalled)
        stalled = d.stalled
        assert (d.recoveries, d.stalled) == (n + 1, 1)
    assert d.reason == "recovery 5000 after interrupted"
    for n in range(9):  # then gangs lost before they save anything: 10 recoveries since the last commit
        stalled, progress = stall(stalled, progress, step)
        stalled = check_retry_budget(policy, notice, 5000 + n, 0, stalled).stalled
    assert stalled == 10
    with pytest.raises(RetryBudgetExhaustedError,
                       match=r"10 recoveries in a row without a newer checkpoint \(max_stalled_recoveries=10\)"):
        check_retry_budget(policy, notice, 5009, 0, stall(stalled, progress, step)[0])
    assert stall(10, progress, step + 1) == (0, step + 1)  # one newer commit and it may go on
    crash = classify_attempt({0: 3})  # a user restart neither counts nor resets the stall
    assert check_retry_budget(Recovery(max_user_restarts=1), crash, 0, 0, 7).stalled == 7


def test_user_errors_follow_the_restart_policy() -> None:
    crash = classify_attempt({0: 3})
    with pytest.raises(RetryBudgetExhaustedError, match="max_user_restarts=0"):
        check_retry_budget(Recovery(), crash, 0, 0)  # default: no user restarts
    d = check_retry_budget(Recovery(max_user_restarts=1), crash, 5, 0)
    assert (d.charge, d.recoveries, d.user_restarts) == (Charge.USER_RESTART, 5, 1)
    only_oom = Recovery(max_user_restarts=3, retry_exit_codes=[137])
    with pytest.raises(RetryBudgetExhaustedError, match=r"exit code 3 is not in retry_exit_codes \[137\]"):
        check_retry_budget(only_oom, crash, 0, 0)
    assert check_retry_budget(only_oom, classify_attempt({1: 137}), 0, 2).user_restarts == 3


def test_a_refusal_is_named_first_and_never_retried() -> None:
    """Exit 80 (REFUSED): the trainer refused its checkpoint; every attempt would refuse it alike."""
    refused = classify_attempt({0: 77, 1: 1, 2: 80})  # peers die of the broken collective around it
    assert (refused.outcome, refused.rank, refused.exit_code) == (Verdict.USER_ERROR, 2, 80)
    assert "refused to start on rank 2" in refused.reason
    for policy in (Recovery(max_user_restarts=5), Recovery(max_user_restarts=5, retry_exit_codes=[80])):
        with pytest.raises(RetryBudgetExhaustedError, match="not retried: every attempt would refuse it alike"):
            check_retry_budget(policy, refused, 0, 0)


def test_finished_attempts_are_not_retried() -> None:
    with pytest.raises(ValueError):
        check_retry_budget(Recovery(), classify_attempt({0: 0}), 0, 0)
