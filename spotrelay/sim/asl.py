"""A small interpreter of the job-run ASL, so the simulator takes the workflow's paths as written.

It reads ``functions/workflows/job_run.asl.json`` itself: Pass (Result/ResultPath), Task (Parameters
with ``.$`` paths, ResultPath, Catch by error name, TimeoutSecondsPath), Choice (the comparison
operators below, And/Or/Not, Default), Wait (Seconds/SecondsPath), Succeed and Fail. A Task's
resource names its handler: the ``${fn_...}`` placeholder of ``Resource`` or, for
``.waitForTaskToken`` tasks, of ``Parameters.FunctionName``. Retry is not interpreted (simulated
tasks do not fail transiently). Anything else in the file raises ``AslError``, so a workflow change
the simulator cannot follow fails its tests instead of being skipped.

The walker never sleeps: ``advance`` runs states until one has to wait, and returns what it waits
for (``Sleep(seconds)`` or ``Await(wait, timeout_s)``); the event loop calls ``resume`` later.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ASL_PATH = Path(__file__).resolve().parents[2] / "functions" / "workflows" / "job_run.asl.json"
_PLACEHOLDER = re.compile(r"\$\{(\w+)\}")


class AslError(RuntimeError):
    """The ASL uses something this interpreter does not implement."""


class TaskFailed(Exception):
    """A simulated task raised ``error`` (an exception class name, as the Lambda would report)."""

    def __init__(self, error: str, cause: str = "") -> None:
        super().__init__(f"{error}: {cause}")
        self.error, self.cause = error, cause


@dataclass(frozen=True, slots=True)
class Sleep:
    seconds: float


@dataclass(frozen=True, slots=True)
class Await:
    wait: str  # "ready" | "outcome": the Payload's "wait"
    timeout_s: float | None


@dataclass(frozen=True, slots=True)
class Finished:
    state: str  # the Succeed or Fail state reached
    failed: bool


Handler = Callable[[dict[str, Any]], Any]


def load_asl(path: Path = ASL_PATH) -> dict[str, Any]:
    return json.loads(path.read_text())


def get_path(doc: Any, path: str) -> Any:
    """JSONPath subset: ``$``, ``$.a.b``. Missing keys raise KeyError."""
    if path == "$":
        return doc
    if not path.startswith("$."):
        raise AslError(f"unsupported path {path!r}")
    for part in path[2:].split("."):
        doc = doc[part]
    return doc


def set_path(doc: dict[str, Any], path: str | None, value: Any) -> dict[str, Any]:
    if path is None:
        return doc
    if path == "$":
        return value if isinstance(value, dict) else {"value": value}
    parts = path[2:].split(".")
    target = doc
    for part in parts[:-1]:
        target = target.setdefault(part, {})
    target[parts[-1]] = value
    return doc


def _params(template: Any, data: dict[str, Any], context: dict[str, Any]) -> Any:
    if isinstance(template, dict):
        out = {}
        for key, value in template.items():
            if key.endswith(".$"):
                out[key[:-2]] = get_path(context, "$" + value[2:]) if value.startswith("$$.") else get_path(data, value)
            else:
                out[key] = _params(value, data, context)
        return out
    return template


_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "StringEquals": lambda a, b: isinstance(a, str) and a == b,
    "NumericEquals": lambda a, b: isinstance(a, int | float) and a == b,
    "NumericLessThan": lambda a, b: isinstance(a, int | float) and a < b,
    "NumericGreaterThan": lambda a, b: isinstance(a, int | float) and a > b,
    "NumericLessThanEquals": lambda a, b: isinstance(a, int | float) and a <= b,
    "NumericGreaterThanEquals": lambda a, b: isinstance(a, int | float) and a >= b,
    "BooleanEquals": lambda a, b: isinstance(a, bool) and a == b,
}


def choice_matches(rule: dict[str, Any], data: dict[str, Any]) -> bool:
    if "And" in rule:
        return all(choice_matches(r, data) for r in rule["And"])
    if "Or" in rule:
        return any(choice_matches(r, data) for r in rule["Or"])
    if "Not" in rule:
        return not choice_matches(rule["Not"], data)
    try:
        value = get_path(data, rule["Variable"])
        present = True
    except (KeyError, TypeError):
        value, present = None, False
    if "IsPresent" in rule:
        return present is rule["IsPresent"]
    if "IsNull" in rule:
        return present and (value is None) is rule["IsNull"]
    ops = [k for k in rule if k not in ("Variable", "Next")]
    if len(ops) != 1:
        raise AslError(f"choice rule {rule} has no single operator")
    op = ops[0]
    if op.endswith("Path"):
        op, other = op[:-4], get_path(data, rule[ops[0]])
    else:
        other = rule[op]
    if op not in _COMPARE:
        raise AslError(f"choice operator {op} is not implemented by the simulator")
    return present and _COMPARE[op](value, other)


def resource_name(state: dict[str, Any]) -> str:
    """The handler a Task calls: its ``${fn_x}`` placeholder name."""
    resource = str(state.get("Resource", ""))
    if resource.endswith(".waitForTaskToken"):
        resource = str(state.get("Parameters", {}).get("FunctionName", ""))
    found = _PLACEHOLDER.fullmatch(resource)
    if not found:
        raise AslError(f"task resource {resource!r} names no ${{fn_...}} handler")
    return found.group(1)


class Walker:
    """One execution of the state machine over ``data`` (the execution's JSON document)."""

    def __init__(self, definition: dict[str, Any], handlers: dict[str, Handler], data: dict[str, Any]) -> None:
        self.states: dict[str, dict[str, Any]] = definition["States"]
        self.handlers, self.data = handlers, data
        self.current: str = definition["StartAt"]
        self.visited: list[str] = []
        self._pending: dict[str, Any] | None = None  # the waiting Task state

    def _goto(self, name: str) -> None:
        if name not in self.states:
            raise AslError(f"state {name!r} does not exist")
        self.current = name

    def _catch(self, state: dict[str, Any], error: str, cause: str) -> None:
        for catcher in state.get("Catch", []):
            names = catcher["ErrorEquals"]
            if error in names or ("States.ALL" in names and not error.startswith("States.Runtime")):
                self.data = set_path(self.data, catcher.get("ResultPath", "$"), {"Error": error, "Cause": cause})
                self._goto(catcher["Next"])
                return
        raise AslError(f"state {self.current}: error {error} is not caught")

    def _after_task(self, state: dict[str, Any], result: Any) -> None:
        self.data = set_path(self.data, state.get("ResultPath", "$"), result)
        self._goto(state["Next"])

    def advance(self) -> Sleep | Await | Finished:
        """Run states until one must wait (or the execution ends)."""
        while True:
            name = self.current
            state = self.states[name]
            self.visited.append(name)
            kind = state["Type"]
            if kind == "Pass":
                self.data = set_path(self.data, state.get("ResultPath", "$"),
                                     copy.deepcopy(state.get("Result", self.data)))
                self._goto(state["Next"])
            elif kind == "Choice":
                target = next((r["Next"] for r in state["Choices"] if choice_matches(r, self.data)), None)
                if target is None and "Default" not in state:
                    raise AslError(f"choice {name}: no rule matched and no Default")
                self._goto(target or state["Default"])
            elif kind == "Wait":
                seconds = state["Seconds"] if "Seconds" in state else get_path(self.data, state["SecondsPath"])
                self._goto(state["Next"])
                return Sleep(float(seconds))
            elif kind == "Task":
                handler = resource_name(state)
                payload = _params(state.get("Parameters", {}), self.data, {"Task": {"Token": name}})
                if str(state.get("Resource", "")).endswith(".waitForTaskToken"):
                    timeout = (get_path(self.data, state["TimeoutSecondsPath"]) if "TimeoutSecondsPath" in state
                               else state.get("TimeoutSeconds"))
                    self._pending = state
                    return Await(str(payload.get("Payload", {}).get("wait", handler)),
                                 None if timeout is None else float(timeout))
                if handler not in self.handlers:
                    raise AslError(f"task {name}: no simulated handler for {handler}")
                try:
                    result = self.handlers[handler](payload)
                except TaskFailed as exc:
                    self._catch(state, exc.error, exc.cause)
                    continue
                self._after_task(state, result)
            elif kind in ("Succeed", "Fail"):
                return Finished(name, kind == "Fail")
            else:
                raise AslError(f"state type {kind} is not implemented by the simulator")

    def resume(self, result: dict[str, Any] | None = None, error: str | None = None) -> Sleep | Await | Finished:
        """Complete the waiting task with ``result`` (SendTaskSuccess) or fail it with ``error``."""
        if self._pending is not None:
            state, self._pending = self._pending, None
            if error is not None:
                self._catch(state, error, "")
            else:
                self._after_task(state, result)
        return self.advance()
