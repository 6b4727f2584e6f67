"""The hot-spare path in the twin, short: a 2-node job with one spare loses a node without notice;
the spare takes its rank from its own local tier (no boot, no download) and training finishes.
Waits for conditions only (the job's terminal status); nothing here depends on the machine's speed.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from spotrelay.adapters.dynamodb_job_store import DynamoDBJobStore
from spotrelay.contracts.control import read_events
from spotrelay.local.code_delivery import deliver_script_dir
from spotrelay.local.compute import LocalInstance
from spotrelay.local.market import MarketModel
from spotrelay.local.reference import read_results
from spotrelay.local.twin import Twin, TwinOptions
from tests.e2e.waits import wait_for, wait_terminal

ROOT = Path(__file__).resolve().parents[2]
STEPS, EVERY = 40, 5
HOLD_AT = 20  # rank 1 waits after this step of attempt 1 (until it is killed): the kill always lands
# before attempt 1 can finish, however long the spare takes to hold a step on a loaded machine
HOLDS = re.compile(r"spare holds step (\d+) locally")

pytestmark = pytest.mark.slow


def _spec() -> str:
    data = yaml.safe_load((ROOT / "examples" / "tiny.yaml").read_text())
    data["entrypoint"]["args"] = ["--engine", "ddp", "--steps", str(STEPS), "--step-sleep", "0.3", "--out", "result",
                                  "--hold-rank", "1", "--hold-at", str(HOLD_AT)]
    data["checkpoint"]["every_steps"] = EVERY
    data["resources"]["spares"] = 1
    data.pop("tracking", None)
    return yaml.safe_dump(data)


@pytest.fixture
def twin(moto_server: object, tmp_path: Path) -> Iterator[Twin]:
    market = MarketModel(regions=["us-east-1", "us-west-2"], boot_time_s=100, time_scale=0.01)
    (tmp_path / "ami").mkdir()
    t = Twin(TwinOptions(root=tmp_path, market=market, moto=moto_server,  # type: ignore[arg-type]
                         code_dir=tmp_path / "ami", reconcile_every_s=5)).start()
    yield t
    t.stop()


def _held(li: LocalInstance) -> int | None:
    try:
        steps = HOLDS.findall((li.work_dir / "agent.log").read_text())
    except OSError:
        return None
    return int(steps[-1]) if steps else None


def test_a_hot_spare_takes_a_lost_rank_from_its_local_tier(twin: Twin) -> None:
    assert twin.compute is not None and twin.dispatcher is not None
    compute = twin.compute
    key = twin.submit(deliver_script_dir(_spec(), ROOT), "spare.yaml")
    # the spare (launch rank 2, beyond the gang) holds a committed step: now rank 1 vanishes
    spare = wait_for(lambda: next((li for li in compute.instances() if li.instance.rank == 2), None), "no spare",
                     every=0.5)
    held = wait_for(lambda: _held(spare), "the spare never held a checkpoint", every=0.5)
    compute.kill(next(li for li in compute.instances() if li.instance.rank == 1).instance.instance_id)
    job = wait_terminal(twin, key)
    errors = [(d.function, d.error) for d in twin.dispatcher.deliveries if d.error]
    assert job.status.value == "SUCCEEDED", (job.reasons, job.attempts, errors)
    assert job.attempt == 2 and job.recoveries == 1

    # the spare serves rank 1 in attempt 2; no node was booted for the gang
    lives = {li.instance.instance_id: li for li in twin.compute.instances()}
    served = {(n.attempt, n.rank): n.instance_id for n in DynamoDBJobStore().nodes_of(job.job_id) if not n.spare}
    assert served[(2, 1)] == spare.instance.instance_id
    assert not [li for li in lives.values() if li.instance.attempt == 2 and (li.instance.rank or 0) < 2]  # no boot

    # it restored the newest commit before the loss, which it already held locally
    events, _ = read_events(spare.work_dir / "control")
    [resumed] = [e for e in events if e.kind == "resumed" and e.attempt == 2]
    assert resumed.step % EVERY == 0 and resumed.step >= held
    assert f"spare holds step {resumed.step} locally" in (spare.work_dir / "agent.log").read_text()
    assert any(e.kind == "first_step" and e.attempt == 2 and e.world_size == 2 for e in events)
    assert job.attempts[1].resumed_from_step == resumed.step  # what the trainers restored, reported
    final = read_results(spare.work_dir / "result")
    assert final[1]["exit"] == 0 and final[1]["losses"][-1][0] == STEPS - 1
