"""A step-by-step interpreter of the job-run ASL file for the property tests: the real definition
(functions/workflows/job_run.asl.json), its Parameters, ResultPath, Retry, Catch and Choice rules,
with each Lambda task served by a callable and each ``.waitForTaskToken`` wait held open until the
workflow port completes its token or the test times it out. Waits take no time.

moto's Step Functions runs the same file in the integration and e2e tests; this one exists because
a property test needs to decide, between any two states, what else happens (hundreds of runs in
seconds). It covers the subset of ASL the file uses and refuses anything else loudly.
"""

from __future__ import annotations

import copy
import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spotrelay.errors import ConflictError

ASL = Path(__file__).resolve().parents[2] / "functions" / "workflows" / "job_run.asl.json"
_tokens = itertools.count(1)

Invoke = Callable[[str, dict[str, Any]], Any]  # (function name, payload) -> result


class TaskError(Exception):
    """A task's failure as Step Functions sees it: an error name and a cause."""

    def __init__(self, name: str, cause: str = "") -> None:
        super().__init__(f"{name}: {cause}")
        self.name, self.cause = name, cause


def _get(data: Any, path: str, context: dict[str, Any]) -> Any:
    root, rest = (context, path[2:]) if path.startswith("$$") else (data, path[1:])
    for part in [p for p in rest.split(".") if p]:
        root = root[part]
    return copy.deepcopy(root)


def _resolve(template: Any, data: Any, context: dict[str, Any]) -> Any:
    if isinstance(template, dict):
        out = {}
        for key, value in template.items():
            if key.endswith(".$"):
                out[key[:-2]] = _get(data, value, context)
            else:
                out[key] = _resolve(value, data, context)
        return out
    if isinstance(template, list):
        return [_resolve(v, data, context) for v in template]
    return template


def _put(data: dict[str, Any], path: str | None, value: Any) -> dict[str, Any]:
    if path is None:
        return data
    if path == "$":
        return copy.deepcopy(value)
    parts = path[2:].split(".")
    target = data
    for part in parts[:-1]:
        target = target.setdefault(part, {})
    target[parts[-1]] = copy.deepcopy(value)
    return data


def _matches(rule: dict[str, Any], data: Any) -> bool:
    if "And" in rule:
        return all(_matches(r, data) for r in rule["And"])
    if "Or" in rule:
        return any(_matches(r, data) for r in rule["Or"])
    if "Not" in rule:
        return not _matches(rule["Not"], data)
    try:
        value = _get(data, rule["Variable"], {})
    except (KeyError, TypeError):
        return bool(rule.get("IsPresent") is False)
    for op in ("StringEquals", "BooleanEquals", "NumericEquals"):
        if op in rule:
            return bool(value == rule[op])
    if "IsPresent" in rule:
        return bool(rule["IsPresent"])
    raise NotImplementedError(f"choice rule {rule} is not supported by the test interpreter")


def _function(resource: str) -> str:
    """``${fn_sfn_plan}`` -> ``sfn_plan``."""
    return resource.removeprefix("${fn_").removesuffix("}")


class Execution:
    """One job-run execution. ``step()`` runs the current state unless it waits for a token."""

    def __init__(self, data: dict[str, Any], invoke: Invoke, definition: dict[str, Any] | None = None) -> None:
        self.definition = definition or json.loads(ASL.read_text())
        self.states: dict[str, Any] = self.definition["States"]
        self.current: str = self.definition["StartAt"]
        self.data = data
        self.invoke = invoke
        self.status = "RUNNING"  # | SUCCEEDED | FAILED | ABORTED
        self.token: str | None = None  # the open wait's token
        self.history: list[str] = []

    @property
    def waiting(self) -> bool:
        return self.token is not None

    def wait_kind(self) -> str | None:
        """``ready`` / ``outcome`` while a wait is open."""
        if self.token is None:
            return None
        return str(self.states[self.current]["Parameters"]["Payload"].get("wait"))

    # --- driving --------------------------------------------------------------------------------
    def step(self, duplicate: bool = False) -> None:
        """Run one state. ``duplicate``: a Lambda task runs twice (its first result was lost and
        Step Functions' retry ran it again), as at-least-once delivery allows."""
        if self.status != "RUNNING" or self.token is not None:
            return
        state = self.states[self.current]
        self.history.append(self.current)
        kind = state["Type"]
        if kind == "Pass":
            value = state["Result"] if "Result" in state else _resolve(state.get("Parameters"), self.data, {})
            self.data = _put(self.data, state.get("ResultPath", "$"), value if value is not None else self.data)
            self._next(state)
        elif kind == "Wait":
            self._next(state)
        elif kind == "Choice":
            chosen = next((c["Next"] for c in state["Choices"] if _matches(c, self.data)), state.get("Default"))
            if chosen is None:
                self._fail("States.NoChoiceMatched", self.current)
            else:
                self.current = chosen
        elif kind == "Succeed":
            self.status = "SUCCEEDED"
        elif kind == "Fail":
            self.status = "FAILED"
        elif kind == "Task":
            self._task(state, duplicate)
        else:
            raise NotImplementedError(f"state type {kind} is not supported by the test interpreter")

    def _task(self, state: dict[str, Any], duplicate: bool) -> None:
        resource = state["Resource"]
        token: str | None = None
        if resource.endswith(".waitForTaskToken"):
            token = f"token-{next(_tokens)}"
            params = _resolve(state["Parameters"], self.data, {"Task": {"Token": token}})
            name, payload = _function(params["FunctionName"]), params["Payload"]
            self.token = token  # valid from the moment the task starts: the Lambda may complete it
        else:
            name, payload = _function(resource), _resolve(state.get("Parameters"), self.data, {})
        here, tries = self.current, 0
        while True:
            try:
                result = self.invoke(name, payload)
                if duplicate:
                    result = self.invoke(name, payload)
                break
            except TaskError as exc:
                tries += 1
                if token is not None and (self.token != token or self.current != here):
                    return  # the wait was completed before the Lambda failed: it has moved on
                if not self._retries(state, exc.name, tries):
                    self.token = None
                    self._catch(state, exc.name, exc.cause)
                    return
        if token is not None:
            return  # the wait stays open until its token is completed (or it already was)
        self.data = _put(self.data, state.get("ResultPath", "$"), result)
        self._next(state)

    def _retries(self, state: dict[str, Any], error: str, tries: int) -> bool:
        for retrier in state.get("Retry", []):
            if error in retrier["ErrorEquals"] or "States.ALL" in retrier["ErrorEquals"]:
                return tries <= int(retrier.get("MaxAttempts", 3))
        return False

    def _catch(self, state: dict[str, Any], error: str, cause: str) -> None:
        for catcher in state.get("Catch", []):
            if error in catcher["ErrorEquals"] or "States.ALL" in catcher["ErrorEquals"]:
                self.data = _put(self.data, catcher.get("ResultPath", "$"), {"Error": error, "Cause": cause})
                self.current = catcher["Next"]
                return
        self._fail(error, cause)

    def _fail(self, error: str, cause: str) -> None:
        self.status = "FAILED"
        self.history.append(f"failed: {error} {cause}")

    def _next(self, state: dict[str, Any]) -> None:
        if state.get("End"):
            self.status = "SUCCEEDED"
        else:
            self.current = state["Next"]

    # --- the token's other side (the Workflow port) ------------------------------------------
    def complete(self, token: str, output: dict[str, Any] | None = None, error: str | None = None,
                 cause: str = "") -> None:
        """SendTaskSuccess / SendTaskFailure: a token that is not the open one is refused, as Step
        Functions refuses a closed or unknown token (TaskTimedOut / InvalidToken)."""
        if self.status != "RUNNING" or token != self.token:
            raise ConflictError(f"task token {token} is not open")
        state = self.states[self.current]
        self.token = None
        if error is not None:
            self._catch(state, error, cause)
            return
        self.data = _put(self.data, state.get("ResultPath", "$"), output)
        self._next(state)

    def time_out(self) -> None:
        """The open wait's TimeoutSeconds (or HeartbeatSeconds) passed."""
        if self.token is None:
            return
        self.token = None
        self._catch(self.states[self.current], "States.Timeout", "the wait timed out")

    def abort(self) -> None:
        self.status, self.token = "ABORTED", None
