"""The hot-spare path in the twin, short: a 2-node job with one spare loses a node without notice;
the spare takes its rank from its own local tier (no boot, no download) and training finishes.
Waits for conditions only (the job's terminal status); nothing here depends on the machine's speed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from spotrelay.adapters.dynamodb_job_store import DynamoDBJobStore
from spotrelay.contracts.control import read_events
from spotrelay.domain.models import Job
from spotrelay.local.chaos import ChaosDriver
from spotrelay.local.code_delivery import deliver_script_dir
from spotrelay.local.market import ChaosAction, MarketModel
from spotrelay.local.reference import read_results
from spotrelay.local.twin import Twin, TwinOptions

ROOT = Path(__file__).resolve().parents[2]
STEPS, KILL_AT, EVERY = 30, 12, 5

pytestmark = pytest.mark.slow


def _spec() -> str:
    data = yaml.safe_load((ROOT / "examples" / "tiny.yaml").read_text())
    data["entrypoint"]["args"] = ["--engine", "ddp", "--steps", str(STEPS), "--step-sleep", "0.3", "--out", "result"]
    data["checkpoint"]["every_steps"] = EVERY
    data["resources"]["spares"] = 1
    data.pop("tracking", None)
    return yaml.safe_dump(data)


@pytest.fixture
def twin(moto_server: object, tmp_path: Path) -> Iterator[Twin]:
    market = MarketModel(regions=["us-east-1", "us-west-2"], boot_time_s=100, time_scale=0.01,
                         chaos=[ChaosAction("kill", "1", at_step=KILL_AT, attempt=1)])
    (tmp_path / "ami").mkdir()
    t = Twin(TwinOptions(root=tmp_path, market=market, moto=moto_server,  # type: ignore[arg-type]
                         code_dir=tmp_path / "ami", reconcile_every_s=5)).start()
    yield t
    t.stop()


def _wait_terminal(twin: Twin, key: str, timeout: float) -> Job:
    deadline = time.time() + timeout
    job = None
    while time.time() < deadline:
        job = twin.job_for_key(key)
        if job is not None and job.status.terminal:
            return job
        time.sleep(1)
    raise AssertionError(f"job not finished in {timeout}s: {job and (job.status, job.attempt, job.reasons)}")


def test_a_hot_spare_takes_a_lost_rank_from_its_local_tier(twin: Twin) -> None:
    assert twin.compute is not None and twin.dispatcher is not None
    chaos = ChaosDriver(twin.market, twin.compute).start()
    try:
        job = _wait_terminal(twin, twin.submit(deliver_script_dir(_spec(), ROOT), "spare.yaml"), timeout=900)
    finally:
        chaos.stop()
    errors = [(d.function, d.error) for d in twin.dispatcher.deliveries if d.error]
    assert job.status.value == "SUCCEEDED", (job.reasons, job.attempts, errors)
    assert [f.kind for f in chaos.fired] == ["kill"] and job.attempt == 2 and job.recoveries == 1

    # the spare booted with the gang (launch rank 2, beyond the gang) serves rank 1 in attempt 2
    lives = {li.instance.instance_id: li for li in twin.compute.instances()}
    served = {(n.attempt, n.rank): n.instance_id for n in DynamoDBJobStore().nodes_of(job.job_id) if not n.spare}
    spare = lives[served[(2, 1)]]
    assert (spare.instance.attempt, spare.instance.rank) == (1, 2)
    assert not [li for li in lives.values() if li.instance.attempt == 2 and (li.instance.rank or 0) < 2]  # no boot

    # it restored the newest commit before the loss, which it already held locally
    events, _ = read_events(spare.work_dir / "control")
    [resumed] = [e for e in events if e.kind == "resumed" and e.attempt == 2]
    assert resumed.step % EVERY == 0 and resumed.step <= chaos.fired[0].step  # type: ignore[operator]
    assert f"spare holds step {resumed.step} locally" in (spare.work_dir / "agent.log").read_text()
    assert any(e.kind == "first_step" and e.attempt == 2 and e.world_size == 2 for e in events)
    assert job.attempts[1].resumed_from_step == resumed.step  # what the trainers restored, reported
    final = read_results(spare.work_dir / "result")
    assert final[1]["exit"] == 0 and final[1]["losses"][-1][0] == STEPS - 1
