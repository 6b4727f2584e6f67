"""The one seam that runs our Lambda handlers inside moto (tests and the local twin).

moto's no-Docker Lambda backend routes every Invoke (including Step Functions Task states) through
``LambdaSimpleBackend.invoke``. We replace it with a dispatcher that maps the function name to our
handler, returns its JSON result, and on an exception reports it the way AWS does: the
``x-amz-function-error`` header plus ``{"errorType": <class name>, ...}``, so the ASL's Retry/Catch
on exception class names behave as in production.
"""

from __future__ import annotations

import importlib
import json
import logging
import threading
import traceback
from collections.abc import Callable
from typing import Any

from spotrelay.resources import function_name_for

log = logging.getLogger(__name__)

Handler = Callable[[dict[str, Any], Any], Any]
_registry: dict[str, Handler] = {}
_lock = threading.Lock()
_installed = False


class LambdaContext:
    """The parts of the Lambda context object that Powertools reads."""

    def __init__(self, name: str) -> None:
        self.function_name = name
        self.function_version = "$LATEST"
        self.invoked_function_arn = f"arn:aws:lambda:us-east-1:123456789012:function:{name}"
        self.memory_limit_in_mb = 512
        self.aws_request_id = "local"
        self.log_group_name = f"/aws/lambda/{name}"
        self.log_stream_name = "local"

    def get_remaining_time_in_millis(self) -> int:
        return 300_000


def register(function_name: str, handler: Handler) -> None:
    with _lock:
        _registry[function_name] = handler


def register_module(handler_module: str, prefix: str = "spotrelay-") -> str:
    """Register ``functions.<handler_module>.handler`` under its function name; return the name."""
    module = importlib.import_module(f"functions.{handler_module}")
    name = function_name_for(handler_module, prefix)
    register(name, module.handler)
    return name


def _short_name(function_name: str) -> str:
    # moto passes a name or an ARN (arn:aws:lambda:region:acct:function:name[:qualifier])
    if function_name.startswith("arn:"):
        return function_name.split(":")[6]
    return function_name


def dispatch(function_name: str, payload: dict[str, Any]) -> tuple[Any, str | None]:
    """Call the registered handler; return (result, error type or None)."""
    name = _short_name(function_name)
    handler = _registry.get(name)
    if handler is None:
        return {"errorType": "FunctionNotRegistered", "errorMessage": name}, "FunctionNotRegistered"
    try:
        return handler(payload, LambdaContext(name)), None
    except Exception as exc:  # reported like Lambda does, the class name is the error type
        log.info("handler %s raised %s: %s", name, type(exc).__name__, exc)
        return {
            "errorType": type(exc).__name__,
            "errorMessage": str(exc),
            "stackTrace": traceback.format_exception(exc)[-5:],
        }, type(exc).__name__


def _invoke(self: Any, function_name: str, qualifier: str | None, body: Any, headers: Any,
            response_headers: Any) -> bytes:
    payload = json.loads(body) if body else {}
    result, error = dispatch(function_name, payload)
    if error is not None:
        response_headers["x-amz-function-error"] = "Unhandled"
    return json.dumps(result, default=str).encode()


def _patch_early_callbacks() -> None:
    """A ``.waitForTaskToken`` task with HeartbeatSeconds whose Lambda completes its own token during
    the invocation (register_wait settles at once when the nodes reported first) must take that
    outcome, as Step Functions does. moto sets up the heartbeat endpoint after the invocation, so the
    early SendTaskSuccess never reaches it and the task ends in a heartbeat timeout: look at the
    outcome already received before waiting for a heartbeat."""
    from moto.stepfunctions.parser.asl.component.state.exec.state_task.service import (
        state_task_service_callback as callback_task,
    )

    cls = callback_task.StateTaskServiceCallback
    original = cls._wait_for_task_token_heartbeat

    def wait_heartbeat(self: Any, env: Any, callback_endpoint: Any, heartbeat_endpoint: Any) -> Any:
        early = callback_endpoint.get_outcome()
        if early is not None:
            return early
        return original(self, env, callback_endpoint, heartbeat_endpoint)

    cls._wait_for_task_token_heartbeat = wait_heartbeat  # type: ignore[method-assign]


def install() -> None:
    """Patch moto's no-Docker Lambda backend and its early-callback gap (idempotent)."""
    global _installed
    if _installed:
        return
    from moto.awslambda_simple.models import LambdaSimpleBackend

    LambdaSimpleBackend.invoke = _invoke  # type: ignore[method-assign]
    _patch_early_callbacks()
    _installed = True
