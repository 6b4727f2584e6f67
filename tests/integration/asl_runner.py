"""The property tests' driver of the job-run ASL (functions/workflows/job_run.asl.json): one state
per ``step``, each Lambda task served by a callable, each ``.waitForTaskToken`` wait held open until
the workflow port completes its token or the test times it out. Waits take no time.

The ASL's semantics (paths, Parameters, ResultPath, Retry, Catch, Choice) are the simulator's
``spotrelay.sim.asl.Machine``: one interpreter for both. moto's Step Functions runs the same file in
the integration and e2e tests; this driver exists because a property test needs to decide, between
any two states, what else happens (hundreds of runs in seconds).
"""

from __future__ import annotations

import itertools
import json
import traceback
from collections.abc import Callable
from typing import Any

from spotrelay.errors import ConflictError
from spotrelay.sim.asl import AslError, Machine, TaskFailed, load_asl

_tokens = itertools.count(1)

Invoke = Callable[[str, dict[str, Any]], Any]  # (function name, payload) -> result
TaskError = TaskFailed  # a task's failure as Step Functions sees it: an error name and a cause


class Execution:
    """One job-run execution. ``step()`` runs the current state unless it waits for a token."""

    def __init__(self, data: dict[str, Any], invoke: Invoke, definition: dict[str, Any] | None = None) -> None:
        self.machine = Machine(definition or load_asl(), data, copy_values=True)
        self.invoke = invoke
        self.token: str | None = None  # the open wait's token

    @property
    def status(self) -> str:
        return self.machine.status

    @property
    def current(self) -> str:
        return self.machine.current

    @property
    def data(self) -> dict[str, Any]:
        return self.machine.data

    @property
    def history(self) -> list[str]:
        error = self.machine.error
        return self.machine.visited + ([f"failed: {error[0]} {error[1]}"] if error else [])

    @property
    def waiting(self) -> bool:
        return self.token is not None

    def wait_kind(self) -> str | None:
        """``ready`` / ``outcome`` while a wait is open."""
        if self.token is None:
            return None
        return str(self.machine.states[self.current]["Parameters"]["Payload"].get("wait"))

    def step(self, duplicate: bool = False) -> None:
        """Run one state. ``duplicate``: a Lambda task runs twice (its first result was lost and
        Step Functions' retry ran it again), as at-least-once delivery allows."""
        m = self.machine
        if m.status != "RUNNING" or self.token is not None:
            return
        state = m.enter()
        kind = state["Type"]
        if kind == "Pass":
            m.run_pass(state)
        elif kind == "Wait":
            m.wait_seconds(state)
        elif kind == "Choice":
            m.run_choice(state)
        elif kind in ("Succeed", "Fail"):
            m.status = "SUCCEEDED" if kind == "Succeed" else "FAILED"
        elif kind == "Task":
            self._task(state, duplicate)
        else:
            raise AslError(f"state type {kind} is not supported")

    def _task(self, state: dict[str, Any], duplicate: bool) -> None:
        token = f"token-{next(_tokens)}"
        call = self.machine.task_call(state, token)
        if call.waits:
            self.token = token  # valid from the moment the task starts: the Lambda may complete it
        name = call.handler.removeprefix("fn_")
        here, tries = self.current, 0
        while True:
            try:
                result = self.invoke(name, call.payload)
                if duplicate:
                    result = self.invoke(name, call.payload)
                break
            except TaskFailed as exc:
                tries += 1
                if call.waits and (self.token != token or self.current != here):
                    return  # the wait was completed before the Lambda failed: it has moved on
                if not self.machine.task_failed(state, exc.error, exc.cause, tries):
                    self.token = None
                    return
        if not call.waits:
            self.machine.task_done(state, result)
        # else the wait stays open until its token is completed (or it already was)

    # --- the token's other side (the Workflow port) ------------------------------------------
    def complete(self, token: str, output: dict[str, Any] | None = None, error: str | None = None,
                 cause: str = "") -> None:
        """SendTaskSuccess / SendTaskFailure: a token that is not the open one is refused, as Step
        Functions refuses a closed or unknown token (TaskTimedOut / InvalidToken)."""
        if self.status != "RUNNING" or token != self.token:
            raise ConflictError(f"task token {token} is not open")
        state = self.machine.states[self.current]
        self.token = None
        if error is not None:
            self.machine.task_failed(state, error, cause)
        else:
            self.machine.task_done(state, output)

    def time_out(self) -> None:
        """The open wait's TimeoutSeconds (or HeartbeatSeconds) passed."""
        if self.token is None:
            return
        self.token = None
        self.machine.task_failed(self.machine.states[self.current], "States.Timeout", "the wait timed out")

    def abort(self) -> None:
        self.machine.status, self.token = "ABORTED", None


class AslWorkflow:
    """The Workflow port in front of the interpreted execution; counts every completion call."""

    def __init__(self) -> None:
        self.execution: Execution | None = None
        self.sends: dict[str, set[str]] = {}  # token -> the distinct answers sent for it
        self.senders: dict[str, list[str]] = {}  # token -> who completed it (the call sites), for a failure

    def start(self, job_id: str, payload: dict[str, Any], name: str | None = None) -> str:
        return f"arn:aws:states:us-east-1:123456789012:execution:spotrelay-job-run:{name or job_id}"

    def stop(self, execution_arn: str, cause: str) -> None:
        assert self.execution is not None
        self.execution.abort()

    def _count(self, token: str, answer: Any) -> None:
        self.sends.setdefault(token, set()).add(json.dumps(answer, sort_keys=True, default=str))
        where = [f"{f.name}:{f.lineno}" for f in traceback.extract_stack()[-8:-2] if "spotrelay" in f.filename]
        self.senders.setdefault(token, []).append(" < ".join(reversed(where)))

    def send_success(self, task_token: str, output: dict[str, Any]) -> None:
        self._count(task_token, output)
        assert self.execution is not None
        self.execution.complete(task_token, output=output)

    def send_failure(self, task_token: str, error: str, cause: str) -> None:
        self._count(task_token, [error, cause])
        assert self.execution is not None
        self.execution.complete(task_token, error=error, cause=cause)

    def send_heartbeat(self, task_token: str) -> None:
        if self.execution is None or self.execution.token != task_token:
            raise ConflictError(f"task token {task_token} is not open")

    def describe(self, execution_arn: str) -> dict[str, Any]:
        assert self.execution is not None
        return {"executionArn": execution_arn, "status": self.execution.status}
