"""Workflow port on Step Functions: one standard execution per job, named after the job id."""

from __future__ import annotations

import json
from typing import Any

from botocore.exceptions import ClientError

from spotrelay.adapters.aws import client, error_code
from spotrelay.errors import ConflictError, NotFoundError, PermanentError, RetryableError
from spotrelay.settings import settings


class SfnWorkflow:
    def __init__(self, state_machine_arn: str | None = None) -> None:
        self._arn = state_machine_arn

    @property
    def _sfn(self) -> Any:
        return client("stepfunctions")

    @property
    def state_machine_arn(self) -> str:
        arn = self._arn or settings().state_machine_arn
        if not arn:
            raise PermanentError("SPOTRELAY_STATE_MACHINE_ARN is not set")
        return arn

    def execution_arn(self, job_id: str) -> str:
        # arn:aws:states:<region>:<acct>:stateMachine:<name> -> ...:execution:<name>:<job_id>
        return self.state_machine_arn.replace(":stateMachine:", ":execution:") + f":{job_id}"

    def start(self, job_id: str, payload: dict[str, Any], name: str | None = None) -> str:
        try:
            response = self._sfn.start_execution(
                stateMachineArn=self.state_machine_arn, name=name or job_id, input=json.dumps(payload)
            )
            return str(response["executionArn"])
        except ClientError as exc:
            code = error_code(exc)
            if code == "ExecutionAlreadyExists":
                # a redelivered submission (or a retried hand-over): that execution already started
                return self.execution_arn(name or job_id)
            if code in ("ThrottlingException", "ServiceUnavailable"):
                raise RetryableError(f"start_execution throttled for {job_id}") from exc
            if code in ("StateMachineDoesNotExist", "InvalidArn"):
                raise PermanentError(f"state machine {self.state_machine_arn} is missing") from exc
            raise

    def stop(self, execution_arn: str, cause: str) -> None:
        try:
            self._sfn.stop_execution(executionArn=execution_arn, error="Cancelled", cause=cause[:32768])
        except ClientError as exc:
            if error_code(exc) == "ExecutionDoesNotExist":
                raise NotFoundError(f"execution {execution_arn} not found") from exc
            raise

    def _token_call(self, method: str, **kwargs: Any) -> None:
        try:
            getattr(self._sfn, method)(**kwargs)
        except ClientError as exc:
            if error_code(exc) in ("TaskTimedOut", "TaskDoesNotExist", "InvalidToken"):
                # the wait already ended (timeout, duplicate completion): a late event
                raise ConflictError(f"task token no longer valid ({error_code(exc)})") from exc
            raise

    def send_success(self, task_token: str, output: dict[str, Any]) -> None:
        self._token_call("send_task_success", taskToken=task_token, output=json.dumps(output))

    def send_failure(self, task_token: str, error: str, cause: str) -> None:
        self._token_call("send_task_failure", taskToken=task_token, error=error, cause=cause[:32768])

    def send_heartbeat(self, task_token: str) -> None:
        self._token_call("send_task_heartbeat", taskToken=task_token)

    def describe(self, execution_arn: str) -> dict[str, Any]:
        try:
            out: dict[str, Any] = self._sfn.describe_execution(executionArn=execution_arn)
            return out
        except ClientError as exc:
            if error_code(exc) == "ExecutionDoesNotExist":
                raise NotFoundError(f"execution {execution_arn} not found") from exc
            raise
