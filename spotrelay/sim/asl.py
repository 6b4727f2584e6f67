"""The one interpreter of the job-run ASL in this repository (``Machine``), so the simulator and the
property tests take the workflow's paths as written.

It reads ``functions/workflows/job_run.asl.json`` itself: Pass (InputPath/Result/Parameters/ResultPath), Task
(Parameters with ``.$`` and ``$$.`` paths and the ``States.MathAdd(path, n)`` intrinsic, ResultPath, Retry and
Catch by error name, TimeoutSeconds(Path)), Choice (``sim/asl_data.py``'s rules, Default), Wait
(Seconds/SecondsPath), Succeed and Fail. A Task's resource names its handler: the ``${fn_...}``
placeholder of ``Resource`` or, for ``.waitForTaskToken`` tasks, of ``Parameters.FunctionName``.
Anything else in the file raises ``AslError``, so a workflow change the simulator cannot follow
fails its tests instead of being skipped.

Two drivers: ``Walker`` (the simulator) never sleeps: ``advance`` runs states until one has to wait,
and returns what it waits for (``Sleep(seconds)`` or ``Await(wait, timeout_s)``); the event loop
calls ``resume`` later. Simulated tasks do not fail transiently, so it takes no Retry. The property
tests' ``Execution`` (tests/integration/asl_runner.py) runs one state per step, with task tokens,
Retry and duplicated invocations.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import spotrelay
from spotrelay.sim.asl_data import AslError, choice_matches, get_path, resolve, set_path

__all__ = ["AslError", "Await", "Finished", "Machine", "Sleep", "TaskFailed", "Walker", "choice_matches",
           "get_path", "load_asl", "resolve", "set_path"]

# (from the package, not this file: the native build's modules live under build/sim-native, spotrelay/sim_native.py)
ASL_PATH = Path(spotrelay.__file__).resolve().parents[1] / "functions" / "workflows" / "job_run.asl.json"
_PLACEHOLDER = re.compile(r"\$\{(\w+)\}")


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


@dataclass(frozen=True, slots=True)
class TaskCall:
    handler: str  # the ``${fn_x}`` placeholder's name
    payload: Any
    waits: bool  # ``.waitForTaskToken``: the task ends when its token is completed
    timeout_s: float | None


Handler = Callable[[dict[str, Any]], Any]


def load_asl(path: Path = ASL_PATH) -> dict[str, Any]:
    return json.loads(path.read_text())


def _caught(names: list[str], error: str) -> bool:
    return error in names or ("States.ALL" in names and not error.startswith("States.Runtime"))



_RESOURCES: dict[int, tuple[dict[str, Any], str]] = {}  # id(state) -> (state, its handler name)


def resource_name(state: dict[str, Any]) -> str:
    """The handler a Task calls: its ``${fn_x}`` placeholder name."""
    cached = _RESOURCES.get(id(state))
    if cached is not None and cached[0] is state:
        return cached[1]
    resource = str(state.get("Resource", ""))
    if resource.endswith(".waitForTaskToken"):
        resource = str(state.get("Parameters", {}).get("FunctionName", ""))
    found = _PLACEHOLDER.fullmatch(resource)
    if not found:
        raise AslError(f"task resource {resource!r} names no ${{fn_...}} handler")
    _RESOURCES[id(state)] = (state, found.group(1))
    return found.group(1)


_CHECKED: dict[int, dict[str, Any]] = {}  # id(definition) -> definition, once its fields passed


def check_fields(definition: dict[str, Any]) -> None:
    """Raise ``AslError`` for input/output processing this interpreter does not implement
    (``InputPath`` is implemented on Pass states only)."""
    if _CHECKED.get(id(definition)) is definition:
        return
    for name, state in definition["States"].items():
        unsupported = {"OutputPath", "ResultSelector"} & set(state)
        if "InputPath" in state and state["Type"] != "Pass":
            unsupported.add("InputPath")
        if unsupported:
            raise AslError(f"state {name}: {sorted(unsupported)} is not implemented by the simulator")
    _CHECKED[id(definition)] = definition


class Machine:
    """The ASL's semantics, one state at a time: what a state does to the execution's data and
    which state comes next. The simulator's ``Walker`` and the property tests' step-by-step
    execution (tests/integration/asl_runner.py) drive this one class; neither interprets ASL itself.

    ``copy_values``: deep-copy values read from and written into the data (the property tests hand
    payloads to real services that may keep them; the simulator's handlers only read them).
    """

    def __init__(self, definition: dict[str, Any], data: dict[str, Any], copy_values: bool = False) -> None:
        check_fields(definition)
        self.states: dict[str, dict[str, Any]] = definition["States"]
        self.current: str = definition["StartAt"]
        self.data = data
        self.status = "RUNNING"  # | SUCCEEDED | FAILED | ABORTED
        self.error: tuple[str, str] | None = None  # an error no Catch took (the execution failed with it)
        self.visited: list[str] = []
        self._copy = copy_values

    def _value(self, value: Any) -> Any:
        return copy.deepcopy(value) if self._copy else value

    def enter(self) -> dict[str, Any]:
        """The current state, recorded as visited."""
        self.visited.append(self.current)
        return self.states[self.current]

    def goto(self, name: str) -> None:
        if name not in self.states:
            raise AslError(f"state {name!r} does not exist")
        self.current = name

    def next(self, state: dict[str, Any]) -> None:
        if state.get("End"):
            self.status = "SUCCEEDED"
        else:
            self.goto(state["Next"])

    def fail(self, error: str, cause: str = "") -> None:
        self.status, self.error = "FAILED", (error, cause)

    def run_pass(self, state: dict[str, Any]) -> None:
        data = get_path(self.data, state["InputPath"]) if "InputPath" in state else self.data
        if "Result" in state:
            value = copy.deepcopy(state["Result"])
        elif "Parameters" in state:
            value = resolve(state["Parameters"], data, {}, self._copy)
        else:
            value = self._value(data) if data is not self.data else data
        self.data = set_path(self.data, state.get("ResultPath", "$"), value)
        self.next(state)

    def run_choice(self, state: dict[str, Any]) -> None:
        target = next((r["Next"] for r in state["Choices"] if choice_matches(r, self.data)), state.get("Default"))
        if target is None:
            self.fail("States.NoChoiceMatched", self.current)
        else:
            self.goto(target)

    def wait_seconds(self, state: dict[str, Any]) -> float:
        """A Wait state's seconds; the machine moves past it (the driver decides whether time passes)."""
        seconds = state["Seconds"] if "Seconds" in state else get_path(self.data, state["SecondsPath"])
        self.next(state)
        return float(seconds)

    def task_call(self, state: dict[str, Any], token: str) -> TaskCall:
        """What a Task invokes: its handler, the payload (Parameters resolved, ``$$.Task.Token`` =
        ``token``) and, for ``.waitForTaskToken``, the wait's timeout."""
        waits = str(state.get("Resource", "")).endswith(".waitForTaskToken")
        payload = resolve(state.get("Parameters", {}), self.data, {"Task": {"Token": token}}, self._copy)
        timeout = None
        if waits:
            payload = payload.get("Payload", payload)
            raw = (get_path(self.data, state["TimeoutSecondsPath"]) if "TimeoutSecondsPath" in state
                   else state.get("TimeoutSeconds"))
            timeout = None if raw is None else float(raw)
        return TaskCall(resource_name(state), payload, waits, timeout)

    def task_done(self, state: dict[str, Any], result: Any) -> None:
        self.data = set_path(self.data, state.get("ResultPath", "$"), self._value(result))
        self.next(state)

    def task_failed(self, state: dict[str, Any], error: str, cause: str = "", tries: int = 0) -> bool:
        """The task failed with ``error`` for the ``tries``-th time: True when a Retry runs it again
        (``tries`` 0: retries are not modeled), else the matching Catch is taken or the execution fails."""
        retrier = next((r for r in state.get("Retry", []) if _caught(r["ErrorEquals"], error)), None)
        if tries and retrier is not None and tries <= int(retrier.get("MaxAttempts", 3)):
            return True
        for catcher in state.get("Catch", []):
            if _caught(catcher["ErrorEquals"], error):
                self.data = set_path(self.data, catcher.get("ResultPath", "$"), {"Error": error, "Cause": cause})
                self.goto(catcher["Next"])
                return False
        self.fail(error, cause)
        return False


class Walker:
    """The simulator's driver: one execution over ``data``, run until a state must wait."""

    def __init__(self, definition: dict[str, Any], handlers: dict[str, Handler], data: dict[str, Any]) -> None:
        self.machine = Machine(definition, data)
        self.handlers = handlers
        self._pending: dict[str, Any] | None = None  # the waiting Task state

    @property
    def visited(self) -> list[str]:
        return self.machine.visited

    @property
    def data(self) -> dict[str, Any]:
        return self.machine.data

    def _check(self) -> None:
        if self.machine.error is not None and self.machine.error[0] != "States.NoChoiceMatched":
            raise AslError(f"state {self.machine.current}: error {self.machine.error[0]} is not caught")
        if self.machine.error is not None:
            raise AslError(f"choice {self.machine.current}: no rule matched and no Default")

    def advance(self) -> Sleep | Await | Finished:
        """Run states until one must wait (or the execution ends)."""
        m = self.machine
        while True:
            self._check()
            if m.status == "SUCCEEDED":
                return Finished(m.current, False)
            name = m.current
            state = m.enter()
            kind = state["Type"]
            if kind == "Pass":
                m.run_pass(state)
            elif kind == "Choice":
                m.run_choice(state)
            elif kind == "Wait":
                return Sleep(m.wait_seconds(state))
            elif kind == "Task":
                call = m.task_call(state, name)
                if call.waits:
                    self._pending = state
                    return Await(str(call.payload.get("wait", call.handler)), call.timeout_s)
                if call.handler not in self.handlers:
                    raise AslError(f"task {name}: no simulated handler for {call.handler}")
                try:
                    result = self.handlers[call.handler](call.payload)
                except TaskFailed as exc:
                    m.task_failed(state, exc.error, exc.cause)
                    continue
                m.task_done(state, result)
            elif kind in ("Succeed", "Fail"):
                return Finished(name, kind == "Fail")
            else:
                raise AslError(f"state type {kind} is not implemented by the simulator")

    def resume(self, result: dict[str, Any] | None = None, error: str | None = None) -> Sleep | Await | Finished:
        """Complete the waiting task with ``result`` (SendTaskSuccess) or fail it with ``error``."""
        if self._pending is not None:
            state, self._pending = self._pending, None
            if error is not None:
                self.machine.task_failed(state, error)
            else:
                self.machine.task_done(state, result)
        return self.advance()
