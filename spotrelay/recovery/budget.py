"""The retry budget: may this attempt's end be retried, and which counter pays for it.

- interrupted, node-lost and infra-error ends spend a recovery: ``max_recoveries`` over the job's
  life (unset: no cap), and ``max_stalled_recoveries`` in a row without progress: a recovery after
  which the job has committed a checkpoint newer than its newest at that recovery does not count
  towards the next (``stall``). Spot is meant to be interrupted: a long job on it recovers hundreds of
  times, each after saving its work, and must not fail for that; one whose gangs keep going before
  they save anything (reclaimed while booting, a node that never comes up) makes no progress and stops;
- user-error ends spend a user restart (``max_user_restarts``), and only for codes in
  ``retry_exit_codes`` when that list is not empty (empty means: any user exit code);
- a refusal (exit REFUSED: a checkpoint the trainer cannot use, a global batch its world cannot
  split) is never retried, whatever the lists say: the next attempt would refuse the same checkpoint;
- succeeded and cancelled ends are never retried.

When the budget is spent, ``RetryBudgetExhaustedError`` says which limit and why the attempt ended;
the workflow turns it into FAILED with that reason.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from spotrelay.contracts.exit_codes import ExitCode
from spotrelay.contracts.recovery import AttemptEnd, Verdict
from spotrelay.errors import RetryBudgetExhaustedError
from spotrelay.spec.models import Recovery


class Charge(StrEnum):
    RECOVERY = "recovery"
    USER_RESTART = "user-restart"


class RetryDecision(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    charge: Charge
    recoveries: int  # counters AFTER this retry
    user_restarts: int
    reason: str
    stalled: int = 0  # recoveries in a row without progress, this one included (a user restart: unchanged)


def stall(stalled: int, progress_step: int, committed_step: int) -> tuple[int, int]:
    """(stalled recoveries before this one, the progress step) given the job's newest committed step
    now: a checkpoint newer than the one at the last recovery (``progress_step``) resets the count.
    Counting from the recovery before, not this attempt's own saves, keeps a notice's final save in:
    it commits after the recovery that the notice started."""
    if committed_step > progress_step:
        return 0, committed_step
    return stalled, progress_step


def check_retry_budget(
    policy: Recovery, outcome: AttemptEnd, recoveries_used: int, user_restarts_used: int, stalled_used: int = 0
) -> RetryDecision:
    """Allow one more attempt and say what it costs, or raise ``RetryBudgetExhaustedError``.
    ``stalled_used``: recoveries in a row without progress before this one (``stall``)."""
    if not outcome.retryable:
        raise ValueError(f"an attempt that ended {outcome.outcome} is not retried")
    if outcome.outcome is Verdict.USER_ERROR:
        code = outcome.exit_code
        if code == ExitCode.REFUSED:
            raise RetryBudgetExhaustedError(f"{outcome.reason}; not retried: every attempt would refuse it alike")
        if policy.retry_exit_codes and code not in policy.retry_exit_codes:
            raise RetryBudgetExhaustedError(
                f"{outcome.reason}; exit code {code} is not in retry_exit_codes {policy.retry_exit_codes}"
            )
        if user_restarts_used >= policy.max_user_restarts:
            raise RetryBudgetExhaustedError(
                f"{outcome.reason}; user restarts spent ({user_restarts_used} of "
                f"max_user_restarts={policy.max_user_restarts})"
            )
        return RetryDecision(charge=Charge.USER_RESTART, recoveries=recoveries_used,
                             user_restarts=user_restarts_used + 1, stalled=stalled_used,
                             reason=f"user restart {user_restarts_used + 1}/{policy.max_user_restarts}")
    if policy.max_recoveries is not None and recoveries_used >= policy.max_recoveries:
        raise RetryBudgetExhaustedError(
            f"{outcome.reason}; recoveries spent ({recoveries_used} of max_recoveries={policy.max_recoveries})"
        )
    if stalled_used >= policy.max_stalled_recoveries:
        raise RetryBudgetExhaustedError(
            f"{outcome.reason}; {stalled_used} recoveries in a row without a newer checkpoint "
            f"(max_stalled_recoveries={policy.max_stalled_recoveries})"
        )
    cap = "" if policy.max_recoveries is None else f"/{policy.max_recoveries}"
    return RetryDecision(charge=Charge.RECOVERY, recoveries=recoveries_used + 1,
                         user_restarts=user_restarts_used, stalled=stalled_used + 1,
                         reason=f"recovery {recoveries_used + 1}{cap} after {outcome.outcome}")
