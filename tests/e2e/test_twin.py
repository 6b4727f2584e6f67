"""The local twin end to end, short: one 2-node job is submitted by an S3 drop, a spot notice hits
one node mid-run, the controller recovers it, and training finishes from the saved step.

Everything is real: moto's server with the resources from spotrelay.resources, the ASL executed by
moto's Step Functions, the handlers through the Lambda seam and the rules->SQS dispatcher, agent
processes with their own fake IMDS, torch training under torchrun (gloo).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from spotrelay.contracts.control import read_events
from spotrelay.local.chaos import ChaosDriver
from spotrelay.local.code_delivery import deliver_script_dir
from spotrelay.local.market import ChaosAction, MarketModel
from spotrelay.local.reference import read_results
from spotrelay.local.twin import Twin, TwinOptions
from tests.e2e.waits import wait_terminal

ROOT = Path(__file__).resolve().parents[2]
STEPS, NOTICE_AT, HOLD_AT = 24, 8, 12  # rank 1 holds after step 12 until told to stop: the notice
# always lands before attempt 1 can finish, however slow the machine is

pytestmark = pytest.mark.slow


def _spec() -> str:
    data = yaml.safe_load((ROOT / "examples" / "tiny.yaml").read_text())
    # DDP + DCP starts faster than DeepSpeed (the demo runs the DeepSpeed engine)
    data["entrypoint"]["args"] = ["--engine", "ddp", "--steps", str(STEPS), "--step-sleep", "0.3", "--out", "result",
                                  "--hold-rank", "1", "--hold-at", str(HOLD_AT)]
    data["checkpoint"]["every_steps"] = 5
    # 24 steps would all fit into the notice window: stop at the notice here (the demo trains on)
    data["entrypoint"].setdefault("env", {})["SPOTRELAY_NOTICE_TRAINING"] = "0"
    data.pop("tracking", None)
    # this test follows a whole new gang after the ranks stopped (the demo shows the default path)
    data["recovery"].update(strategy="replace-cluster", launch_at_notice=False)
    return yaml.safe_dump(data)


@pytest.fixture
def twin(moto_server: object, tmp_path: Path) -> Iterator[Twin]:
    market = MarketModel(
        regions=["us-east-1", "us-west-2"],
        boot_time_s=100,
        time_scale=0.01,
        notice_window_s=120,  # EC2's: the save at the notice never races the reclaim (nothing waits for it)
        chaos=[ChaosAction("interrupt", "1", at_step=NOTICE_AT, attempt=1)],
    )
    (tmp_path / "ami").mkdir()
    t = Twin(
        TwinOptions(
            root=tmp_path,
            market=market,
            moto=moto_server,  # type: ignore[arg-type]
            code_dir=tmp_path / "ami",  # empty: the code is delivered through S3 (entrypoint.code)
            reconcile_every_s=5,
        )
    ).start()
    yield t
    t.stop()


def test_interrupted_job_recovers_and_finishes(twin: Twin) -> None:
    assert twin.compute is not None and twin.dispatcher is not None
    chaos = ChaosDriver(twin.market, twin.compute).start()
    try:
        key = twin.submit(deliver_script_dir(_spec(), ROOT), "tiny-e2e.yaml")
        job = wait_terminal(twin, key)
    finally:
        chaos.stop()

    errors = [(d.function, d.error, d.result) for d in twin.dispatcher.deliveries if d.error]
    assert job.status.value == "SUCCEEDED", (job.reasons, job.attempts, errors)
    assert [f.kind for f in chaos.fired] == ["interrupt"] and chaos.fired[0].node == "a1-r1"
    assert job.attempt == 2 and job.recoveries == 1
    assert job.last_checkpoint is not None and job.last_checkpoint.step == STEPS

    # attempt 1 saved at the notice and exited; attempt 2 resumed from that very step
    nodes = {(li.instance.attempt, li.instance.rank): li for li in twin.compute.instances()}
    assert set(nodes) == {(1, 0), (1, 1), (2, 0), (2, 1)}
    first = read_results(nodes[(1, 0)].work_dir / "result")[0]
    saved_at = max(step for step, _ in first["losses"]) + 1
    # saving at the very step the notice arrived is the best outcome; how far training got before the
    # save depends on how fast this machine is, so only the bounds are checked
    assert NOTICE_AT <= saved_at < STEPS and first["exit"] == 75  # ExitCode.PREEMPTED_SAVED
    events, _ = read_events(nodes[(2, 0)].work_dir / "control")
    assert [e.step for e in events if e.kind == "resumed"] == [saved_at]
    second = read_results(nodes[(2, 0)].work_dir / "result")[0]
    assert second["exit"] == 0 and second["losses"][0][0] == saved_at and second["losses"][-1][0] == STEPS - 1

    # the controller saw it through the real event path: notice, then the recovery
    delivered = [(d.function, d.detail_type) for d in twin.dispatcher.deliveries if d.error is None]
    assert ("spotrelay-on-interruption-notice", "EC2 Spot Instance Interruption Warning") in delivered
    assert twin.compute.list_tagged([]) == []  # every instance torn down
