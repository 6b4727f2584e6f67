"""The node side of an elastic resize, with real agents, real torchrun and real training (gloo).

The test plays the controller's workflow (node items and RESTART directives in moto's DynamoDB; the
agents' events go to the controller's real handler, the one writer of node state) and the instances
(fake IMDS, agent processes). Attempt 1 trains on 2 nodes; a CHECKPOINT_NOW stops it at a
commit. Node 0's agent survives and is carried into attempt 2 alone (RESTART ``world_size=1``): it
restarts torchrun with ``--nnodes=1`` and resumes resharded, the global batch kept by accumulating 2
micro-batches. Stopped again, it is carried into attempt 3 with ``world_size=2`` next to a new node
(empty disk: it resumes from S3), and they train to the end. Every step's loss is within 1e-4
(relative) of one uninterrupted 2-rank run at the same global batch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spotrelay.adapters.dynamodb_job_store import DynamoDBJobStore
from spotrelay.contracts import control
from spotrelay.contracts.events import Directive, DirectiveKind
from spotrelay.contracts.exit_codes import ExitCode
from spotrelay.domain.models import Job, Node, NodeState, Pool, node_id_for
from spotrelay.domain.status import JobStatus
from spotrelay.local.motoserver import free_port
from spotrelay.local.reference import read_progress
from tests.integration.agent_events import AgentEvents, Instances

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
STEPS = 12
JOB = "tiny-elastic-job"
POOL = Pool(region="us-east-1", az="us-east-1a", instance_type="p5.48xlarge", market="spot")
TRAIN_ARGS = ["--engine", "ddp", "--steps", str(STEPS), "--batch", "2", "--global-batch", "4", "--dropout", "0",
              "--samples", "48"]  # fmt: skip
TIMEOUT_S = 300  # a hang, not a speed check
# the survivor (rank 0) waits after step 3 of attempt 1 and step 6 of attempt 2 (it resumes at 4 and
# trains 2 steps alone) until its stop directive arrives: each stop lands before the attempt could end
HOLDS = ["--hold-rank", "0", "--hold-at", "3", "--hold-at", "6@2"]


def _spec(out: Path) -> dict[str, Any]:
    return {
        "version": 1, "name": "tiny-elastic",
        "entrypoint": {"script": "examples/tiny/train.py", "args": [*TRAIN_ARGS, "--step-sleep", "0.3", *HOLDS,
                                                                     "--out", str(out)],
                       "env": {"OMP_NUM_THREADS": "1", "SPOTRELAY_NOTICE_TRAINING": "0"}},
        "resources": {"nodes": 2, "min_nodes": 1, "gpus_per_node": 0},
        "checkpoint": {"every_steps": 4, "keep_local": 2, "keep_s3": 3},
    }  # fmt: skip


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[int, float]:
    """One uninterrupted run on 2 gloo ranks, no agent: step -> global mean loss."""
    tmp = tmp_path_factory.mktemp("reference")
    env = {**os.environ, control.ENV_CHECKPOINT_DIR: str(tmp / "ckpt"), "OMP_NUM_THREADS": "1"}
    for key in (control.ENV_CONTROL_DIR, control.ENV_CHECKPOINT_URI):
        env.pop(key, None)
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2",
                    f"--master-port={free_port()}", "examples/tiny/train.py", *TRAIN_ARGS, "--out", str(tmp / "ref")],
                   cwd=ROOT, env=env, check=True, timeout=TIMEOUT_S, capture_output=True)  # fmt: skip
    return {int(s): float(v) for s, v in json.loads(Path(f"{tmp / 'ref'}.rank0.json").read_text())["losses"]}


class Nodes(Instances):
    """The instances: a fake IMDS and an agent process each (the survivor's lives through attempts)."""

    def __init__(self, store: DynamoDBJobStore, root: Path) -> None:
        super().__init__()
        self.store, self.root = store, root
        self.spec_file = root / "spec.json"
        root.mkdir(parents=True, exist_ok=True)
        self.spec_file.write_text(json.dumps(_spec(root / "out")))

    def launch(self, iid: str, attempt: int, rank: int, nodes: int, port: int, linger_s: float) -> None:
        self.store.put_node(Node(job_id=JOB, node_id=node_id_for(attempt, rank), attempt=attempt, rank=rank,
                                 instance_id=iid, pool=POOL, launched_at=time.time()))  # fmt: skip
        disk = self.root / iid
        self.start(iid, POOL.az, disk, {
            "job_id": JOB, "attempt": attempt, "rank": rank, "nodes": nodes, "nproc_per_node": 1,
            "config_uri": str(self.spec_file), "checkpoint_dir": disk / "ckpt", "master_port": port,
            "imds_poll_s": 0.5, "directive_poll_s": 0.5, "heartbeat_s": 2, "stop_grace_s": 20, "linger_s": linger_s,
        })  # fmt: skip

    def log(self, iid: str) -> str:
        return "".join(p.read_text()[-3000:] for p in sorted((self.root / iid).glob("*.log")))

    def step(self, iid: str) -> int:
        return control.read_progress(self.root / iid / "control") or 0

    def losses(self) -> list[tuple[int, float]]:
        """(step, global mean loss) of every step any rank computed, in any attempt (every run appends
        to the same ``--out`` prefix: the nodes share this test's directory)."""
        return [(int(s), float(v)) for pairs in read_progress(self.root / "out").values() for s, v in pairs]


@pytest.fixture
def nodes(aws: dict[str, str], tmp_path: Path) -> Iterator[Nodes]:
    store = DynamoDBJobStore()
    store.create_job(Job(job_id=JOB, name="tiny-elastic", status=JobStatus.RUNNING, spec=_spec(tmp_path / "unused"),
                         spec_hash="h1", attempt=1))  # fmt: skip
    found = Nodes(store, tmp_path)
    events = AgentEvents(store)
    yield found
    events.stop()
    found.stop()


def _wait(what: str, ok: Any, nodes: Nodes, iid: str) -> None:
    give_up = time.time() + TIMEOUT_S
    while not ok():
        if time.time() > give_up:
            pytest.fail(f"{what} did not happen; log of {iid}:\n{nodes.log(iid)}")
        time.sleep(0.3)


def _stop_at_commit(nodes: Nodes, attempt: int, iid: str) -> None:
    """CHECKPOINT_NOW to rank 0's node item; wait until every node of the attempt exited 75."""
    now = time.time()
    stop = Directive(directive_id=f"d-stop-a{attempt}", kind=DirectiveKind.CHECKPOINT_NOW, deadline=now + 120,
                     reason="grow back at a checkpoint boundary", issued_at=now)  # fmt: skip
    nodes.store.update_node(JOB, node_id_for(attempt, 0),
                            lambda n: n.model_copy(update={"directive": stop.model_dump()}))

    def exited() -> bool:
        mine = [n for n in nodes.store.nodes_of(JOB) if n.attempt == attempt]
        return all(n.state is NodeState.EXITED for n in mine)

    _wait(f"attempt {attempt} stopping", exited, nodes, iid)
    assert {n.exit_code for n in nodes.store.nodes_of(JOB) if n.attempt == attempt} == {ExitCode.PREEMPTED_SAVED}


def _carry(nodes: Nodes, iid: str, attempt: int, rank: int, world: int) -> None:
    """What the controller writes for a kept node: a new item with a RESTART naming the gang size."""
    old = max((n for n in nodes.store.nodes_of(JOB) if n.instance_id == iid), key=lambda n: n.attempt)
    restart = Directive.restart(JOB, attempt, rank, time.time(), "elastic resize", world_size=world)
    nodes.store.put_node(old.model_copy(update={"node_id": node_id_for(attempt, rank), "attempt": attempt,
                                                "rank": rank, "version": 0, "state": NodeState.PENDING,
                                                "exit_code": None, "directive": restart.model_dump(mode="json")}))
    nodes.store.update_job(JOB, lambda j: j.model_copy(update={"attempt": attempt}))  # then the job, as provision


def test_a_survivor_trains_alone_then_grows_back_with_the_same_losses(nodes: Nodes,
                                                                      reference: dict[int, float]) -> None:
    survivor, gone, joiner = "i-0survivor", "i-0gone", "i-0joiner"
    port = free_port()
    nodes.launch(survivor, 1, 0, 2, port, linger_s=TIMEOUT_S)
    nodes.launch(gone, 1, 1, 2, port, linger_s=0)
    _wait("attempt 1 reaching step 3", lambda: nodes.step(survivor) >= 3, nodes, survivor)
    _stop_at_commit(nodes, 1, survivor)
    assert nodes.procs[gone].wait(TIMEOUT_S) == ExitCode.PREEMPTED_SAVED  # not carried: it ends

    _carry(nodes, survivor, 2, 0, world=1)  # capacity for one node only: the survivor trains alone
    shrunk_at = nodes.step(survivor)
    _wait("attempt 2 training alone", lambda: nodes.step(survivor) >= shrunk_at + 2, nodes, survivor)
    _stop_at_commit(nodes, 2, survivor)

    _carry(nodes, survivor, 3, 0, world=2)  # capacity returned: grow back at the checkpoint boundary
    nodes.launch(joiner, 3, 1, 2, port, linger_s=0)  # a new node: its tags say the gang of 2
    for iid in (survivor, joiner):
        assert nodes.procs[iid].wait(TIMEOUT_S) == ExitCode.DONE, nodes.log(iid)

    agent_log = (nodes.root / survivor / "agent.log").read_text()
    launches = [line for line in agent_log.splitlines() if '"msg": "launching"' in line]
    assert [n for line in launches for n in ("1", "2") if f"--nnodes={n}" in line] == ["2", "1", "2"]
    resumed = [json.loads(Path(f"{nodes.root / 'out'}.rank{r}.json").read_text())["resumed_from"] for r in (0, 1)]
    assert resumed[0] == resumed[1] and resumed[0] > shrunk_at  # attempt 3 resumed attempt 2's commit
    computed = nodes.losses()
    assert {s for s, _ in computed} == set(range(STEPS))  # every step, 0-based, was trained by some attempt
    for step, loss in computed:
        assert loss == pytest.approx(reference[step], rel=1e-4), f"step {step}"
