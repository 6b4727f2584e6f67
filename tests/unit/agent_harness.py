"""The harness of tests/unit/test_agent_daemon.py: a stand-in trainer (no torch) that honours the
control contract like agent/training.py, a fake IMDS, and one agent serving a one-node job through
its port in process (tests/agent_port.py: its events go through the controller's real handler)."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.config import AgentConfig
from agent.daemon import Agent
from agent.imds import ImdsClient
from agent.launcher import LaunchPlan, Rendezvous
from agent.reporting import Reporter
from spotrelay.adapters.memory_job_store import MemoryJobStore
from spotrelay.domain.models import Job, Node, Pool
from spotrelay.domain.status import JobStatus
from spotrelay.local.fake_imds import FakeImds
from spotrelay.spec.models import JobSpec
from tests.agent_port import InProcessAgentPort

# The stand-in trainer: one step every 0.1 s; acts on request.json like the training API does. In each
# of its first HOLD starts, its last step waits for a request unless one came already: a test's stop,
# notice or restart then always lands before the run could end, however slow the machine is. A test
# that sends no request lets the held step go with ``release`` once it saw what it waits for.
TRAINER = r"""
import json, os, sys, time
from pathlib import Path
from spotrelay.contracts import control
from spotrelay.contracts.health import HealthAnomaly
ctl = Path(os.environ[control.ENV_CONTROL_DIR])
mode, steps, hold = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
handled = set()
with open(ctl / "starts", "a") as fh:
    fh.write("x")
(ctl / "run_id").write_text(os.environ.get(control.ENV_MLFLOW_RUN_ID, ""))
if mode.startswith("stall"):
    from agent.hang import register_stack_dump
    register_stack_dump(ctl, 0)
first_start = (ctl / "starts").read_text() == "x"
held = len((ctl / "starts").read_text()) <= hold
if mode == "refuse":  # the training API refusing a checkpoint, then the script's own traceback (exit 1)
    from agent.refusal import refusals
    from spotrelay.errors import IncompatibleCheckpointError
    with refusals():
        raise IncompatibleCheckpointError("/ckpt/step-00000004: written by a DeepSpeed session, this run is a "
                                          "torch DDP/FSDP session; resume it with the engine that wrote it")
if mode == "unavailable":  # committed checkpoints S3 would not give now, then the script's traceback
    from agent.refusal import refusals
    from spotrelay.errors import CheckpointUnavailableError
    with refusals():
        raise CheckpointUnavailableError("no checkpoint could be read now, so the run does not start over from "
                                         "step 0 beside them: step-00000004 unusable: s3: download failed")
def commit(step, emergency=False, deadline=None, request_id=None):
    control.append_event(ctl, control.TrainerEvent(kind="checkpoint_committed", step=step, uri=f"s3://b/step-{step}",
        duration_s=0.05, emergency=emergency, deadline=deadline, request_id=request_id, time=time.time()))
for step in range(1, steps + 1):
    time.sleep(0.1)
    control.write_progress(ctl, step)
    print(f"step {step}", flush=True)
    if step == 3 and (mode == "stall" or (mode == "stall-once" and first_start)):
        time.sleep(3600)  # stuck in a collective, say
    if step == 2 and mode == "anomaly":
        found = HealthAnomaly(kind="grad-explosion", action="notify", step=2, value=40.0, detail="grad norm 40x")
        control.append_event(ctl, control.TrainerEvent(kind="anomaly", step=2, anomaly=found, time=time.time()))
    request = control.read_request(ctl)
    while held and not handled and step == steps and (request is None or request.request_id in handled) \
            and not (ctl / "release").exists():
        time.sleep(0.05)
        request = control.read_request(ctl)
    if request is None or request.request_id in handled:
        continue
    handled.add(request.request_id)
    if request.kind == "stop":
        sys.exit(78)
    if mode == "hang":  # a save that never finishes
        time.sleep(3600)
    if request.kind == "checkpoint":
        commit(step, request_id=request.request_id)
    else:
        commit(step, emergency=True, deadline=request.deadline, request_id=request.request_id)
        sys.exit(75)
"""


SPEC = JobSpec.model_validate(
    {
        "version": 1,
        "name": "t",
        "entrypoint": {"script": "trainer.py"},
        "resources": {"nodes": 1, "gpus_per_node": 0},
        "checkpoint": {"every_steps": 100},
    }
)


def rank0_node(**over: Any) -> Node:
    """Rank 0 of attempt 1 of job j-1 on a p5 spot node in us-east-1a."""
    pool = Pool(region="us-east-1", az="us-east-1a", instance_type="p5.48xlarge", market="spot")
    return Node(job_id="j-1", node_id="a1-r0", attempt=1, rank=0, pool=pool, **over)


@pytest.fixture
def imds() -> Iterator[FakeImds]:
    with FakeImds(instance_id="i-0node") as server:
        yield server


def run_agent(
    tmp_path: Path,
    imds: FakeImds,
    mode: str = "ok",
    steps: int = 30,
    hold: int = 0,
    spec: JobSpec = SPEC,
    log_sink: Any = None,
    launches: list[Rendezvous] | None = None,
    **over: Any,
) -> tuple[Agent, MemoryJobStore, InProcessAgentPort, threading.Thread, list[int]]:
    (tmp_path / "trainer.py").write_text(TRAINER)
    config = AgentConfig.model_validate(
        {
            "job_id": "j-1",
            "attempt": 1,
            "rank": 0,
            "nodes": 1,
            "instance_id": "i-0node",
            "private_ip": "127.0.0.1",
            "work_dir": tmp_path,
            "imds_endpoint": imds.url,
            "imds_poll_s": 0.1,
            "directive_poll_s": 0.1,
            "heartbeat_s": 0.5,
            "stop_grace_s": 1.0,
            "linger_s": 0,
            **over,
        }
    )
    job = Job(job_id="j-1", name="t", status=JobStatus.RUNNING, attempt=1, spec=spec.model_dump(mode="json"))
    port = InProcessAgentPort(job)
    store = port.store
    store.put_node(rank0_node(instance_id="i-0node"))

    def plan(spec: JobSpec, rdzv: Rendezvous, env: dict[str, str], itype: str | None, python: str) -> LaunchPlan:
        # no torchrun: the per-rank wrapper straight on the stand-in trainer
        if launches is not None:
            launches.append(rdzv)
        return LaunchPlan(
            [sys.executable, "-m", "agent.launcher", str(tmp_path / "trainer.py"), mode, str(steps), str(hold)],
            {**env, "RANK": "0", "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        )

    client = ImdsClient(imds.url, timeout_s=2.0, retries=1)  # generous: CI machines are loaded
    agent = Agent(config, port, Reporter(config, port), client, plan_builder=plan, log_sink=log_sink)
    view = port.job()
    assert view is not None
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(agent.serve(view, spec, track=True)), daemon=True)
    thread.start()
    return agent, store, port, thread, result


HANG_S = 300.0  # only catches a hang: a loaded CI machine may be slow, never this slow


def wait_for(predicate: Callable[[], bool], timeout: float = HANG_S) -> None:
    give_up = time.time() + timeout
    while not predicate():
        assert time.time() < give_up, f"condition not reached in {timeout}s (a hang)"
        time.sleep(0.05)


def release(tmp_path: Path) -> None:
    """Let a held last step go without a request (the stand-in trainer then ends its run)."""
    (tmp_path / "control" / "release").write_text("")


def finish(thread: threading.Thread, result: list[int]) -> int:
    thread.join(HANG_S)
    assert not thread.is_alive(), f"the agent did not return in {HANG_S}s (a hang)"
    return result[0]
