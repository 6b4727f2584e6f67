"""The agent's hot paths before and after its port, side by side in one run against moto.

- directive poll (every ``directive_poll_s``; the notice path starts here): before, the job store's
  consistent GetItem of the node item; now the port's consistent GetItem of its ``doc`` only;
- heartbeat (every ``heartbeat_s``): before, a read-change-write of the node item (GetItem +
  conditional PutItem) plus the Heartbeat event; now the event alone (the controller writes).

Prints AWS calls per operation and the median latency ratio now/before (moto's latencies are not
AWS's; the ratio and the call counts are what carry over). Usage: ``python bench/agent_port.py [--n 200]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

JOB = "bench-agent-port"


def _timed(op: Callable[[], Any], calls: list[str]) -> tuple[float, int]:
    before = len(calls)
    start = time.perf_counter()
    op()
    return time.perf_counter() - start, len(calls) - before


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200, help="operations per path (interleaved)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()

    from botocore.client import BaseClient

    from spotrelay.adapters.aws_agent_port import AwsAgentPort
    from spotrelay.adapters.dynamodb_job_store import DynamoDBJobStore
    from spotrelay.adapters.eventbridge_publisher import EventBridgePublisher
    from spotrelay.contracts.events import AGENT_SOURCE, Directive, DirectiveKind, Heartbeat
    from spotrelay.domain.models import Job, Node, Pool
    from spotrelay.domain.status import JobStatus
    from spotrelay.local import motoserver, provision
    from spotrelay.settings import reset

    server = motoserver.start(apply_env=True)
    try:
        reset()
        provision.create_storage()
        store, bus = DynamoDBJobStore(), EventBridgePublisher()
        store.create_job(Job(job_id=JOB, name="bench", status=JobStatus.RUNNING, attempt=1))
        directive = Directive(directive_id="d-1", kind=DirectiveKind.CHECKPOINT, issued_at=time.time())
        store.put_node(Node(job_id=JOB, node_id="a1-r0", attempt=1, rank=0, instance_id="i-0bench",
                            pool=Pool(region="us-east-1", az="us-east-1a", instance_type="p5.48xlarge", market="spot"),
                            directive=directive.model_dump(mode="json"), output_tail="x" * 2000))
        port = AwsAgentPort(JOB)
        calls: list[str] = []
        original = BaseClient._make_api_call  # type: ignore[attr-defined]

        def recording(self: BaseClient, operation: str, params: dict[str, Any]) -> Any:
            calls.append(operation)
            return original(self, operation, params)

        BaseClient._make_api_call = recording  # type: ignore[attr-defined]

        def beat() -> Heartbeat:
            return Heartbeat(event_id=f"evt-{time.perf_counter_ns()}", job_id=JOB, node_id="a1-r0",
                             instance_id="i-0bench", attempt=1, rank=0, time=time.time(), step=7)

        def old_heartbeat() -> None:  # what agent/daemon.py did before the port
            now = time.time()
            store.update_node(JOB, "a1-r0", lambda n: n.model_copy(update={"last_heartbeat": now}))
            event = beat()
            bus.publish(AGENT_SOURCE, event.kind, event.model_dump(mode="json"))

        paths: dict[str, Callable[[], Any]] = {
            "directive poll, before (store GetItem)": lambda: store.get_node(JOB, "a1-r0").directive,
            "directive poll, now (port GetItem doc)": lambda: (port.node("a1-r0") or None),
            "heartbeat, before (read-change-write + event)": old_heartbeat,
            "heartbeat, now (event only)": lambda: port.report(beat()),
        }
        seconds: dict[str, list[float]] = {name: [] for name in paths}
        per_op: dict[str, int] = {}
        for _ in range(max(1, args.n)):
            for name, op in paths.items():  # interleaved: the machine's load hits every path alike
                took, made = _timed(op, calls)
                seconds[name].append(took)
                per_op[name] = made
        BaseClient._make_api_call = original  # type: ignore[attr-defined]
    finally:
        server.stop()

    results = {name: {"aws_calls": per_op[name], "median_ms": round(statistics.median(s) * 1000, 3)}
               for name, s in seconds.items()}
    names = list(paths)
    ratios = {"directive_poll_now_over_before": results[names[1]]["median_ms"] / results[names[0]]["median_ms"],
              "heartbeat_now_over_before": results[names[3]]["median_ms"] / results[names[2]]["median_ms"]}
    for name, row in results.items():
        print(f"{name:48s} {row['aws_calls']} AWS call(s)  median {row['median_ms']:8.3f} ms")
    for key, value in ratios.items():
        print(f"{key:48s} {value:.2f}x")
    if args.json:
        args.json.write_text(json.dumps({"n": args.n, "paths": results, "ratios": ratios}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
