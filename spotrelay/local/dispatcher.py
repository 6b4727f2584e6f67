"""The twin's stand-in for EventBridge -> Lambda: rules target SQS queues, this serves them.

One thread per queue long-polls it and calls the rule's handler through the Lambda seam, so the
function runs exactly as Step Functions' Lambda tasks run it (same registry, same error shape). A
failed invocation is retried like Lambda's async retries (the message becomes visible again after a
short delay) and dropped after ``max_receives``, as a dead-letter queue would take it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from spotrelay.local import lambda_seam

log = logging.getLogger(__name__)
ACCOUNT = "123456789012"  # moto's default account


@dataclass(frozen=True)
class Delivery:
    """One handler invocation, for the live view and the demo's timeline."""

    time: float
    function: str
    detail_type: str
    detail: dict[str, Any]
    error: str | None
    result: Any


Listener = Callable[[Delivery], None]


class Dispatcher:
    def __init__(self, routes: dict[str, str], retry_delay_s: int = 2, max_receives: int = 4, wait_s: int = 1) -> None:
        self.routes = routes  # queue URL -> Lambda function name
        self.retry_delay_s = retry_delay_s
        self.max_receives = max_receives
        self.wait_s = wait_s
        self.deliveries: deque[Delivery] = deque(maxlen=500)
        self.listeners: list[Listener] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for url, function in self.routes.items():
            thread = threading.Thread(
                target=self._serve, args=(url, function), daemon=True, name=f"dispatch-{function}"
            )
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=self.wait_s + 5)

    def invoke(self, function: str, event: dict[str, Any]) -> Delivery:
        """Call a handler now (the reconcile schedule uses this too)."""
        result, error = lambda_seam.dispatch(function, event)
        delivery = Delivery(
            time.time(), function, str(event.get("detail-type", "")), dict(event.get("detail") or {}), error, result
        )
        self.deliveries.append(delivery)
        for listener in self.listeners:
            try:
                listener(delivery)
            except Exception:  # a broken view must not stop event delivery
                log.exception("dispatcher listener failed")
        if error:
            log.warning("%s failed with %s: %s", function, error, result)
        return delivery

    def _serve(self, url: str, function: str) -> None:
        from spotrelay.adapters.aws import client

        sqs = client("sqs")
        while not self._stop.is_set():
            try:
                resp = sqs.receive_message(
                    QueueUrl=url,
                    MaxNumberOfMessages=10,
                    WaitTimeSeconds=self.wait_s,
                    AttributeNames=["ApproximateReceiveCount"],
                )
            except Exception:
                if self._stop.is_set():
                    return
                log.exception("receive from %s failed", url)
                time.sleep(1)
                continue
            for msg in resp.get("Messages", []):
                self._handle(sqs, url, function, msg)

    def _handle(self, sqs: Any, url: str, function: str, msg: dict[str, Any]) -> None:
        try:
            event = json.loads(msg["Body"])
        except ValueError:
            log.error("dropping a message that is not JSON on %s", url)
            sqs.delete_message(QueueUrl=url, ReceiptHandle=msg["ReceiptHandle"])
            return
        delivery = self.invoke(function, as_aws_sends(event))
        receives = int(msg.get("Attributes", {}).get("ApproximateReceiveCount", "1"))
        if delivery.error is None or receives >= self.max_receives:
            if delivery.error is not None:
                log.error("%s gave up on an event after %d tries", function, receives)
            sqs.delete_message(QueueUrl=url, ReceiptHandle=msg["ReceiptHandle"])
        else:
            sqs.change_message_visibility(
                QueueUrl=url, ReceiptHandle=msg["ReceiptHandle"], VisibilityTimeout=self.retry_delay_s * receives
            )


def as_aws_sends(event: dict[str, Any]) -> dict[str, Any]:
    """Undo where moto's events differ from AWS's (tests/events/ has the real shapes): its
    EventBridge -> SQS template drops ``account`` and ``version``, and its S3 notifications spell
    the object's ``etag`` as ``eTag``."""
    event.setdefault("account", ACCOUNT)
    event.setdefault("version", "0")
    obj = (event.get("detail") or {}).get("object") if event.get("source") == "aws.s3" else None
    if isinstance(obj, dict) and "eTag" in obj and "etag" not in obj:
        obj["etag"] = obj.pop("eTag")
    return event


def scheduled_event(rule_arn: str, region: str = "us-east-1") -> dict[str, Any]:
    """What an EventBridge schedule rule delivers to its Lambda target."""
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": "123456789012",
        "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": region,
        "resources": [rule_arn],
        "detail": {},
    }


class Ticker:
    """Calls ``fn`` every ``every_s`` seconds on a daemon thread (the reconcile schedule)."""

    def __init__(self, every_s: float, fn: Callable[[], object]) -> None:
        self.every_s = every_s
        self.fn = fn
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="ticker")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.fn()
            except Exception:
                log.exception("scheduled call failed")
