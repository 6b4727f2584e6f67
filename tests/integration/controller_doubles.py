"""Test doubles and helpers for the controller's handler and workflow tests.

``ScriptedCompute`` implements the Compute port with real bookkeeping (instances exist until
terminated; tags by job/attempt/rank) and raises capacity errors per a script, which EC2 in moto
never does. ``QuotedMarket`` returns a fixed price table. Agent events are built from the
real-format samples in tests/events/.
"""

from __future__ import annotations

import copy
import itertools
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

import pytest
from aws_lambda_powertools.utilities.typing import LambdaContext

from spotrelay.domain.models import Job, Node, NodeState, Pool
from spotrelay.domain.status import JobStatus
from spotrelay.errors import InsufficientCapacityError, QuotaExceededError
from spotrelay.ports.compute import Instance, LaunchRequest
from spotrelay.ports.market import PoolQuote
from tests.conftest import load_event

_ids = itertools.count(1)


def pool(itype: str = "p5.48xlarge", market: str = "spot", region: str = "us-east-1",
         az: str = "us-east-1a") -> Pool:
    return Pool(region=region, az=az, instance_type=itype, market=market)


class ScriptedCompute:
    """Compute port double. ``fail`` maps a pool key to the error class its launches raise, or
    takes a callable (pool, launch number) -> error class or None."""

    def __init__(self, fail: dict[str, type[Exception]] | Callable[[Pool, int], type[Exception] | None] | None = None):
        self._fail = fail or {}
        self.live: dict[str, Instance] = {}
        self.profiles: set[str] = set()  # jobs with an agent role (ensured at launch, deleted at teardown)
        self.terminated: list[str] = []
        self.reclaimed: set[str] = set()  # taken by EC2 (``reclaim``): spot_reclaimed says so
        self.tried: list[str] = []  # pool keys, in launch order
        self.launched: list[LaunchRequest] = []
        self.boot_s: dict[str, float] = {}  # instance type -> expected boot (a move's save deadline)

    def _error(self, p: Pool) -> type[Exception] | None:
        if callable(self._fail):
            return self._fail(p, len(self.tried))
        return self._fail.get(p.key)

    def launch(self, request: LaunchRequest) -> list[Instance]:
        self.tried.append(request.pool.key)
        error = self._error(request.pool)
        if error is not None:
            raise error(f"scripted {error.__name__} in {request.pool.key}")
        self.launched.append(request)
        out = []
        for rank in request.ranks:
            iid = f"i-{next(_ids):017x}"
            inst = Instance(instance_id=iid, pool=request.pool, rank=rank, private_ip=f"10.0.0.{rank + 10}",
                            state="running", job_id=request.job_id, attempt=request.attempt)
            self.live[iid] = inst
            out.append(inst)
        self.profiles.add(request.job_id)
        return out

    def _live_now(self) -> list[Instance]:
        # one C-level copy, atomic under the GIL: the workflow's task threads launch and terminate while
        # the test thread reads, and a comprehension over the dict itself can raise "dictionary changed
        # size during iteration" midway (in a workflow task, that fails the task instead of the test)
        return list(self.live.values())

    def expected_boot_s(self, pool: Pool) -> float:
        return self.boot_s.get(pool.instance_type, 300.0)

    def terminate(self, instance_ids: list[str], region: str) -> None:
        for iid in instance_ids:
            if self.live.pop(iid, None) is not None:
                self.terminated.append(iid)

    def reclaim(self, instance_id: str) -> None:
        """EC2 takes the instance (a spot reclaim): gone, and not by our terminate."""
        self.live.pop(instance_id, None)
        self.reclaimed.add(instance_id)

    def crash(self, instance_id: str) -> None:
        """The instance dies (hardware, a kernel panic): gone, not by EC2's interruption nor by us."""
        self.live.pop(instance_id, None)

    def spot_reclaimed(self, instance_id: str, region: str) -> bool:
        return instance_id in self.reclaimed

    def terminate_job(self, job_id: str, regions: list[str]) -> list[str]:
        ids = [i.instance_id for i in self._live_now() if i.job_id == job_id and i.pool.region in regions]
        self.terminate(ids, "")
        self.profiles.discard(job_id)
        return ids

    def list_tagged(self, regions: list[str]) -> list[Instance]:
        return [i for i in self._live_now() if i.pool.region in regions]

    def job_profiles(self, skip: frozenset[str] = frozenset()) -> list[str]:
        return sorted(self.profiles - skip)

    def delete_job_profile(self, job_id: str) -> None:
        self.profiles.discard(job_id)

    def running(self, job_id: str) -> list[str]:
        return [i.instance_id for i in self._live_now() if i.job_id == job_id]


CAPACITY = InsufficientCapacityError
QUOTA = QuotaExceededError

DEFAULT_PRICES = {
    pool("p5.48xlarge", "spot").key: 30.0,
    pool("p4d.24xlarge", "spot").key: 12.0,
    pool("p5.48xlarge", "on-demand").key: 98.0,
    pool("p4d.24xlarge", "on-demand").key: 32.0,
}


class QuotedMarket:
    """MarketData double: a fixed table of pool key -> USD per instance-hour."""

    def __init__(self, prices: dict[str, float] | None = None) -> None:
        self.prices = dict(prices or DEFAULT_PRICES)
        self.history: dict[str, list[tuple[float, float]]] = {}  # pool key -> price changes (a test sets them)
        self.reads: list[bool] = []  # each quotes() call: whether it asked for placement scores

    def price_history(self, pool: Pool, start: float, end: float) -> list[tuple[float, float]]:
        """The changes a test set for the pool, else its fixed price throughout."""
        if pool.key in self.history:
            return list(self.history[pool.key])
        return [(start, self.prices[pool.key])] if pool.key in self.prices else []

    def quotes(self, regions: list[str], instance_types: list[str], markets: list[str],
               capacity: int = 1, scores: bool = True) -> list[PoolQuote]:
        self.reads.append(scores)
        out = []
        for key, price in self.prices.items():
            region, az, itype, market = key.split("/")
            if region in regions and itype in instance_types and market in markets:
                out.append(PoolQuote(pool=Pool(region=region, az=az, instance_type=itype, market=market),
                                     price_per_hour=price, advisor_band=1 if market == "spot" else None))
        return out


def spec(nodes: int = 2, **recovery: Any) -> dict[str, Any]:
    return {
        "version": 1, "name": "wf-test",
        "entrypoint": {"command": ["python", "train.py"]},
        "resources": {"nodes": nodes, "gpus_per_node": 0, "instance_types": ["p5.48xlarge", "p4d.24xlarge"],
                      "regions": ["us-east-1"]},
        "checkpoint": {"every_steps": 10},
        # the original policy (whole new gang after the attempt ended) unless a test asks otherwise
        "recovery": {"max_recoveries": 2, "strategy": "replace-cluster", "launch_at_notice": False, **recovery},
    }


def new_job(store: Any, job_id: str = "job-under-test", status: JobStatus = JobStatus.VALIDATED,
            **recovery: Any) -> Job:
    job = Job(job_id=job_id, name="wf-test", status=status, spec=spec(**recovery), created_at=time.time(),
              updated_at=time.time(), submission_key=f"submissions/{job_id}.yaml")
    store.create_job(job)
    return job


def agent_event(kind: str, node: Node, **fields: Any) -> dict[str, Any]:
    """A real-format EventBridge envelope for an agent event about ``node``."""
    sample = {"NodeReady": "agent_node_ready.json", "Heartbeat": "agent_heartbeat.json",
              "CheckpointCommitted": "agent_checkpoint_committed.json",
              "TrainingExited": "agent_training_exited.json", "Anomaly": "agent_anomaly.json",
              "TrainingResumed": "agent_training_resumed.json",
              "TrainingStarted": "agent_training_started.json", "NoticeSeen": "agent_notice_seen.json",
              "DirectiveSeen": "agent_directive_seen.json", "TrackingStarted": "agent_tracking_started.json"}[kind]
    event = copy.deepcopy(load_event(sample))
    event["id"] = str(uuid.uuid4())
    event["detail"].update({"event_id": f"evt-{uuid.uuid4().hex}", "job_id": node.job_id, "node_id": node.node_id,
                            "instance_id": node.instance_id, "attempt": node.attempt, "rank": node.rank,
                            "time": time.time()})
    if kind == "NodeReady":
        event["detail"].update({"region": node.pool.region, "az": node.pool.az})
    event["detail"].update(fields)
    return event


def ec2_event(sample: str, instance_id: str, at: float | None = None, **detail: Any) -> dict[str, Any]:
    """``sample`` for ``instance_id``, sent at ``at`` (epoch s; default the sample's own time)."""
    event = copy.deepcopy(load_event(sample))
    event["id"] = str(uuid.uuid4())
    if at is not None:
        event["time"] = datetime.fromtimestamp(at, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    event["detail"]["instance-id"] = instance_id
    event["detail"].update(detail)
    event["resources"] = [f"arn:aws:ec2:us-east-1:123456789012:instance/{instance_id}"]
    return event


def wait_until(predicate: Callable[[], Any], timeout: float = 300.0, what: str = "condition") -> Any:  # catches a hang
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


class Ctx:
    """Lambda context for handlers called directly by a test."""

    function_name = "spotrelay-test"
    function_version = "$LATEST"
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:spotrelay-test"
    memory_limit_in_mb = 256
    aws_request_id = "test"

    def get_remaining_time_in_millis(self) -> int:
        return 60_000


def ctx() -> LambdaContext:
    return cast(LambdaContext, Ctx())


class RecordingWorkflow:
    """Workflow port double for handler tests (no execution behind the tokens): records every
    completion and, like Step Functions, refuses a second completion of the same token."""

    def __init__(self) -> None:
        self.completed: list[tuple[str, str, dict[str, Any]]] = []  # (kind, token, output or error)
        self.heartbeats: list[str] = []
        self.executions: dict[str, str] = {}  # arn -> status
        self.inputs: dict[str, dict[str, Any]] = {}  # arn -> its input
        self._closed: set[str] = set()

    def _close(self, token: str) -> None:
        from spotrelay.errors import ConflictError

        if token in self._closed:
            raise ConflictError(f"task token {token} no longer valid")
        self._closed.add(token)

    def start(self, job_id: str, payload: dict[str, Any], name: str | None = None) -> str:
        arn = f"arn:aws:states:us-east-1:123456789012:execution:spotrelay-job-run:{name or job_id}"
        self.executions.setdefault(arn, "RUNNING")
        self.inputs[arn] = payload
        return arn

    def stop(self, execution_arn: str, cause: str) -> None:
        self.executions[execution_arn] = "ABORTED"

    def send_success(self, task_token: str, output: dict[str, Any]) -> None:
        self._close(task_token)
        self.completed.append(("success", task_token, output))

    def send_failure(self, task_token: str, error: str, cause: str) -> None:
        self._close(task_token)
        self.completed.append(("failure", task_token, {"error": error, "cause": cause}))

    def send_heartbeat(self, task_token: str) -> None:
        self.heartbeats.append(task_token)

    def describe(self, execution_arn: str) -> dict[str, Any]:
        from spotrelay.errors import NotFoundError

        if execution_arn not in self.executions:
            raise NotFoundError(execution_arn)
        return {"executionArn": execution_arn, "status": self.executions[execution_arn]}


def running_job(store: Any, compute: ScriptedCompute, nodes: int = 2, status: JobStatus = JobStatus.RUNNING,
                tokens: dict[str, str] | None = None, job_id: str = "job-under-test",
                market: str = "spot") -> tuple[Job, list[Node]]:
    """A job on attempt 1 with a launched gang (as provision leaves it), in ``status``."""
    job = new_job(store, job_id=job_id, status=status)
    where = pool(market=market)
    request = LaunchRequest(job_id=job_id, attempt=1, pool=where, count=nodes, ranks=list(range(nodes)))
    gang = []
    for inst in compute.launch(request):
        node = Node(job_id=job_id, node_id=f"a1-r{inst.rank}", attempt=1, rank=inst.rank,
                    instance_id=inst.instance_id, pool=where, launched_at=time.time(),
                    state=NodeState.PENDING if status is JobStatus.STARTING else NodeState.READY)
        gang.append(store.put_node(node))
    from spotrelay.domain.models import Attempt

    job = store.update_job(job_id, lambda j: j.model_copy(update={
        "attempt": 1, "attempts": [Attempt(number=1, pool=where, price_per_hour=30.0, nodes=nodes,
                                           started_at=time.time())],
        "task_tokens": tokens or {}, "execution_arn": f"arn:aws:states:us-east-1:123456789012:execution:"
                                                      f"spotrelay-job-run:{job_id}"}))
    return job, gang


@dataclass
class Env:
    store: Any
    compute: ScriptedCompute
    stats: Any
    workflow: RecordingWorkflow


@pytest.fixture
def env(aws: dict[str, str]) -> Iterator[Env]:
    """moto storage plus the controller's runtime wired to doubles for compute/market/workflow."""
    from functions import _runtime
    from spotrelay.adapters.dynamodb_job_store import DynamoDBJobStore
    from spotrelay.placement import InMemoryPoolStatsStore

    compute, stats, workflow = ScriptedCompute(), InMemoryPoolStatsStore(), RecordingWorkflow()
    _runtime.set_factories(compute=lambda: compute, market=QuotedMarket, pool_stats=lambda: stats,
                           workflow=lambda: workflow)
    yield Env(DynamoDBJobStore(), compute, stats, workflow)
    _runtime.set_factories(compute=None, market=None, pool_stats=None, workflow=None)


@contextmanager
def replaced(**doubles: Callable[[], Any]) -> Iterator[None]:
    """The runtime's adapters named (``metrics=``, ``notifier=``, ...) built by ``doubles`` while the
    block runs; the defaults again after it."""
    from functions import _runtime

    _runtime.set_factories(**doubles)
    try:
        yield
    finally:
        _runtime.set_factories(**dict.fromkeys(doubles))
