"""The twin's parts on their own: market model, local compute (processes, notices, EC2 events),
and the rules -> SQS -> handler path. Fast: no training."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests
from pydantic import ValidationError

from spotrelay.contracts.workflow import WorkflowTimings
from spotrelay.domain.models import Pool
from spotrelay.errors import InsufficientCapacityError
from spotrelay.local.compute import LocalCompute
from spotrelay.local.ec2_events import Ec2EventBus
from spotrelay.local.market import CapacityRule, ChaosAction, MarketModel, load_removals, trace_interruption_rate
from spotrelay.local.twin import TWIN_TIMINGS, Twin, TwinOptions
from spotrelay.ports.compute import LaunchRequest
from tests.e2e.waits import HANG_S, wait_for

POOL = Pool(region="us-east-1", az="us-east-1a", instance_type="p5.48xlarge", market="spot")

# A stand-in for the agent: reads its IMDS the way the agent does and records what it saw.
PROBE = """
import json, os, time, requests
url = os.environ["SPOTRELAY_AGENT_IMDS_ENDPOINT"]
out = os.path.join(os.environ["SPOTRELAY_AGENT_WORK_DIR"], "probe.json")
while True:
    tok = requests.put(url + "/latest/api/token", headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"}).text
    h = {"X-aws-ec2-metadata-token": tok}
    iid = requests.get(url + "/latest/meta-data/instance-id", headers=h).text
    action = requests.get(url + "/latest/meta-data/spot/instance-action", headers=h)
    with open(out + ".tmp", "w") as fh:
        json.dump({"instance_id": iid, "notice": action.status_code == 200,
                   "rank": os.environ["SPOTRELAY_AGENT_RANK"]}, fh)
    os.replace(out + ".tmp", out)
    time.sleep(0.2)
"""


def test_market_quotes_are_stable_and_spot_is_cheaper() -> None:
    market = MarketModel(regions=["us-east-1", "us-west-2"])
    quotes = market.quotes(["us-east-1", "us-west-2"], ["p5.48xlarge", "p4d.24xlarge"], ["spot", "on-demand"])
    assert len(quotes) == 2 * 2 * 2 * 2
    assert quotes == MarketModel().quotes(
        ["us-east-1", "us-west-2"], ["p5.48xlarge", "p4d.24xlarge"], ["spot", "on-demand"]
    )
    for q in quotes:
        if q.pool.market == "spot":
            assert q.price_per_hour < market.on_demand_price(q.pool.instance_type, q.pool.region)
            assert q.advisor_band is not None
    assert len({q.price_per_hour for q in quotes if q.pool.market == "spot"}) > 1  # pools differ


def test_capacity_rules_fail_matching_launches_then_run_out() -> None:
    market = MarketModel(capacity=[CapacityRule("us-east-1/*/p5.48xlarge/spot", times=2)])
    for _ in range(2):
        with pytest.raises(InsufficientCapacityError):
            market.check_capacity(POOL)
    market.check_capacity(POOL)
    market.check_capacity(POOL.model_copy(update={"instance_type": "p4d.24xlarge"}))


def test_a_capacity_limit_counts_the_live_instances_until_lifted() -> None:
    """The elastic scenario's market: the pool keeps the survivor, and has no room for its replacement."""
    market = MarketModel()
    limit = market.limit_capacity(1, pool="*/spot")
    market.check_capacity(POOL, count=1, live=0)  # a gang of one still fits
    with pytest.raises(InsufficientCapacityError, match=r"0 p5\.48xlarge spot instances left, 1 asked"):
        market.check_capacity(POOL, count=1, live=1)
    with pytest.raises(InsufficientCapacityError):
        market.check_capacity(POOL, count=2, live=0)
    market.check_capacity(POOL.model_copy(update={"market": "on-demand"}), count=2, live=0)  # not matched
    assert market.lift_limits() == 1 and limit not in market.limits
    market.check_capacity(POOL, count=2, live=1)


def test_the_twin_runs_plans_waits_at_its_boot_scale(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One setting: the market's time_scale shortens the boots and reaches Plan as the workflow's
    timings (``WorkflowTimings.time_scale``), next to the twin's short workflow timings."""
    twin = Twin(TwinOptions(root=tmp_path, market=MarketModel(boot_time_s=300, time_scale=0.02)))
    for name, value in twin.workflow_env().items():
        monkeypatch.setenv(name, value)
    timings = WorkflowTimings.from_env()
    assert timings.time_scale == 0.02 and twin.market.boot_delay_s() == 6.0
    assert timings.provision_retry_s == TWIN_TIMINGS["provision_retry_s"]
    monkeypatch.setenv("SPOTRELAY_WF_TIME_SCALE", "fast")
    with pytest.raises(ValidationError, match="time_scale"):
        WorkflowTimings.from_env()


def test_chaos_fires_once_at_its_step() -> None:
    market = MarketModel(chaos=[ChaosAction.parse("interrupt:1@step=10"), ChaosAction.parse("kill:a2-r0@t=5")])
    assert market.due_chaos(step=9, elapsed_s=1, attempt=1) == []
    due = market.due_chaos(step=10, elapsed_s=1, attempt=1)
    assert [(a.kind, a.node) for a in due] == [("interrupt", "1")]
    assert market.due_chaos(step=11, elapsed_s=2, attempt=1) == []
    assert [a.kind for a in market.due_chaos(step=None, elapsed_s=6, attempt=2)] == ["kill"]
    with pytest.raises(ValueError):
        ChaosAction.parse("explode:1")


def test_trace_replay_is_scaled() -> None:
    removals = load_removals()
    assert len(removals) == 74 and removals == sorted(removals)
    assert 0 < trace_interruption_rate() < 5
    market = MarketModel()
    market.use_trace(speedup=1000.0)
    first = removals[0] / 1000.0
    assert market.due_trace_removals(first - 0.01) == 0
    assert market.due_trace_removals(first) >= 1


@pytest.fixture
def compute(aws: dict[str, str], tmp_path: Path) -> Iterator[tuple[LocalCompute, list[tuple[str, dict]]]]:
    seen: list[tuple[str, dict]] = []
    bus = Ec2EventBus()
    bus.listeners.append(lambda kind, detail: seen.append((kind, detail)))
    # a window no node can outlast: seeing a notice never races its reclaim (a test shortens it to
    # check the reclaim itself; 1.5 s here once left a loaded machine's probe no time to see it)
    market = MarketModel(
        boot_time_s=20, time_scale=0.01, notice_window_s=HANG_S, capacity=[CapacityRule("*/p4d.24xlarge/spot")]
    )
    c = LocalCompute(market, tmp_path, agent_cmd=[sys.executable, "-c", PROBE], bus=bus)
    yield c, seen
    c.close()


def _probe(c: LocalCompute, ref: str) -> dict:
    path = c.find(ref).work_dir / "probe.json"

    def seen() -> dict | None:
        return json.loads(path.read_text()) if path.exists() else None

    found: dict = wait_for(seen, f"no probe output at {path}")
    return found


def _wait(condition: Callable[[], bool], why: str) -> None:
    wait_for(condition, why, every=0.1)


def test_local_compute_launch_interrupt_kill(compute: tuple[LocalCompute, list[tuple[str, dict]]]) -> None:
    c, seen = compute
    with pytest.raises(InsufficientCapacityError):
        c.launch(
            LaunchRequest(
                job_id="j",
                attempt=1,
                pool=POOL.model_copy(update={"instance_type": "p4d.24xlarge"}),
                count=2,
                ranks=[0, 1],
            )
        )
    assert c.list_tagged([]) == []

    insts = c.launch(LaunchRequest(job_id="j", attempt=1, pool=POOL, count=2, ranks=[0, 1]))
    assert [i.rank for i in insts] == [0, 1]
    assert {i.job_id for i in c.list_tagged(["us-east-1"])} == {"j"}
    first = _probe(c, "a1-r1")
    assert first["instance_id"] == insts[1].instance_id and first["notice"] is False

    c.interrupt("1")
    _wait(lambda: bool(_probe(c, "1")["notice"]), "the notice never reached the node's IMDS")
    assert seen[0] == (
        "EC2 Spot Instance Interruption Warning",
        {"instance-id": insts[1].instance_id, "instance-action": "terminate"},
    )
    # the notice window ends: the instance is taken (a short window now: nothing has to see this
    # notice; the reclaim is waited for, however slow this machine is)
    c.market.notice_window_s = 0.5
    c.interrupt("0")
    rank0 = next(li for li in c.instances() if li.instance.rank == 0)
    gone = {"instance-id": insts[0].instance_id, "state": "terminated"}
    _wait(lambda: ("EC2 Instance State-change Notification", gone) in seen, "the interrupted instance was never taken")
    assert rank0.end_reason == "interrupted" and rank0.process is not None
    _wait(lambda: rank0.process is not None and rank0.process.poll() is not None, "the taken node's agent lives on")

    killed = c.kill("1")  # noticed, inside its (long) window: it goes at once, without a state change first
    rank1 = next(li for li in c.instances() if li.instance.instance_id == killed)
    assert rank1.end_reason == "killed" and rank1.process is not None and rank1.process.poll() == -9
    assert c.list_tagged([]) == []
    with pytest.raises(requests.ConnectionError):
        requests.put(rank1.imds.url + "/latest/api/token", timeout=30)


def test_cli_faults_reach_the_twin_through_its_control_endpoint(
    compute: tuple[LocalCompute, list[tuple[str, dict]]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from spotrelay.cli.local import local_app
    from spotrelay.local.control import ENV_URL, ControlServer

    c, seen = compute
    insts = c.launch(LaunchRequest(job_id="j", attempt=1, pool=POOL, count=2, ranks=[0, 1]))
    control = ControlServer(c, {}).start()
    try:
        monkeypatch.setenv(ENV_URL, control.url)
        runner = CliRunner()
        nodes = runner.invoke(local_app, ["nodes", "--json"])
        assert nodes.exit_code == 0 and insts[0].instance_id in nodes.output
        assert runner.invoke(local_app, ["interrupt", "a1-r1"]).exit_code == 0
        assert seen[-1][0] == "EC2 Spot Instance Interruption Warning"
        assert runner.invoke(local_app, ["kill", "0"]).exit_code == 0
        assert c.find("a1-r1").alive and not any(li.alive for li in c.instances() if li.instance.rank == 0)
        missing = runner.invoke(local_app, ["kill", "a9-r9"])
        assert missing.exit_code == 1 and "no live instance" in missing.output
    finally:
        control.stop()
    monkeypatch.delenv(ENV_URL)
    gone = runner.invoke(local_app, ["kill", "1", "--state", str(tmp_path / "none.json")])
    assert gone.exit_code == 2


def test_demo_report_costs_recoveries_and_timeline(tmp_path: Path) -> None:
    from spotrelay.local import demo_report as report
    from spotrelay.local.downtime import FaultTimes

    market = MarketModel(boot_time_s=300, time_scale=0.01)
    t0 = 1000.0
    life = {
        "instance_id": "i-1",
        "job_id": "j",
        "attempt": 1,
        "rank": 0,
        "pool": POOL.key,
        "launched_at": t0,
        "booted_at": t0 + 3,
        "notice_at": t0 + 50,
        "ended_at": t0 + 3600,
        "end_reason": "interrupted",
    }
    lives = [life, {**life, "rank": 1, "instance_id": "i-2", "notice_at": None, "end_reason": "killed"}]
    fault = report.Fault("spot-notice", t0 + 50, "a1-r1", "i-1", 20, 1, resumed_at=t0 + 110, resumed_from_step=22)
    cost = report.costs(lives, market, [fault], end=t0 + 3600)
    spot_price = market.quote(POOL).price_per_hour
    assert cost["spot_usd"] == pytest.approx(2 * spot_price, rel=1e-3)
    assert cost["on_demand_same_time_usd"] == pytest.approx(2 * market.on_demand_price("p5.48xlarge"), rel=1e-3)
    assert 0 < cost["savings_vs_on_demand_pct"] < 100
    assert cost["recoveries_usd"] == pytest.approx(60 * 2 * spot_price / 3600, rel=1e-3)
    # training stopped 25 s into a 30 s window, the replacement launched after that
    times = FaultTimes("spot-notice", t0 + 50, t0 + 75, t0 + 110, t0 + 80, t0 + 83, 30.0, t0 + 77, t0 + 80)
    [rec] = report.recoveries([fault], market, [times])
    assert rec["recovery_s"] == 60.0 and rec["downtime_s"] == 35.0
    assert rec["downtime_modeled_s"] == 35.0 - 3.0 + 300.0 and rec["final_commit_before_reclaim_s"] == 3.0
    assert rec["notice_training_share"] == pytest.approx(25 / 30, abs=1e-3)
    assert rec["steps_lost_after_notice"] == 0 and rec["trained_through_notice_steps"] == 2
    met = report.targets([rec], steps_lost=0, bit_identical=True)
    assert met["notice_downtime_modeled_s"]["met"] is False and met["notice_window_training_share"]["met"] is True
    png = tmp_path / "timeline.png"
    report.timeline_png(png, {0: 4.0, 1: 3.9}, {1: {0: 4.0}, 2: {1: 3.9}}, [fault], lives, t0)
    assert png.stat().st_size > 10_000


def test_a_killed_node_leaves_the_losses_it_computed(tmp_path: Path) -> None:
    from spotrelay.local.reference import read_progress, read_results

    prefix = tmp_path / "result"
    (tmp_path / "result.rank0.steps.jsonl").write_text("[0, 2.5]\n[1, 2.25]\n[2, 2.")  # died mid-write
    (tmp_path / "result.rank1.json").write_text(json.dumps({"losses": [[0, 2.5]], "exit": 0}))
    assert read_progress(prefix) == {0: [[0, 2.5], [1, 2.25]]}
    assert list(read_results(prefix)) == [1]  # the progress file is not taken for a result file
