"""The retry budget: may this attempt's end be retried, and which counter pays for it.

- interrupted, node-lost and infra-error ends spend a recovery (``max_recoveries``);
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


def check_retry_budget(
    policy: Recovery, outcome: AttemptEnd, recoveries_used: int, user_restarts_used: int
) -> RetryDecision:
    """Allow one more attempt and say what it costs, or raise ``RetryBudgetExhaustedError``."""
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
                             user_restarts=user_restarts_used + 1,
                             reason=f"user restart {user_restarts_used + 1}/{policy.max_user_restarts}")
    if recoveries_used >= policy.max_recoveries:
        raise RetryBudgetExhaustedError(
            f"{outcome.reason}; recoveries spent ({recoveries_used} of max_recoveries={policy.max_recoveries})"
        )
    return RetryDecision(charge=Charge.RECOVERY, recoveries=recoveries_used + 1,
                         user_restarts=user_restarts_used,
                         reason=f"recovery {recoveries_used + 1}/{policy.max_recoveries} after {outcome.outcome}")
