"""``spotrelay describe | cost | logs`` against moto's server: a job with two attempts, a recovery,
an anomaly and checkpoints in S3; logs from a twin's node files and from CloudWatch Logs."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from spotrelay.adapters.aws import client
from spotrelay.adapters.cloudwatch_logs import CloudWatchTrainingLogs
from spotrelay.adapters.dynamodb_job_store import DynamoDBJobStore
from spotrelay.cli import inspect as cli_inspect
from spotrelay.cli import main as cli_main
from spotrelay.cli.main import app
from spotrelay.domain.models import AnomalyRecord, Attempt, CheckpointRef, Job, Node, NodeState, Pool
from spotrelay.domain.status import JobStatus
from spotrelay.placement import catalog

runner = CliRunner()
POOL = Pool(region="us-east-1", az="us-east-1a", instance_type="p5.48xlarge", market="spot")
T0 = 1_764_000_000.0


def _job(aws: dict[str, str]) -> Job:
    store = DynamoDBJobStore()
    attempts = [
        Attempt(number=1, pool=POOL, started_at=T0, ended_at=T0 + 3600, end_reason="interrupted", nodes=2,
                price_per_hour=30.0, cost=60.0),
        Attempt(number=2, pool=POOL, started_at=T0 + 3900, ended_at=T0 + 5700, end_reason="succeeded", nodes=2,
                price_per_hour=30.0, cost=30.0, resumed_from_step=400),
    ]
    anomaly = AnomalyRecord(attempt=1, node_id="a1-r0", kind="non-finite", action="rollback", step=123,
                            detail="loss or gradient norm is NaN/Inf", time=T0 + 100)
    job = Job(job_id="j-seen", name="llm", status=JobStatus.SUCCEEDED, attempt=2, attempts=attempts, recoveries=1,
              last_step=600, steps_lost=7, cost_so_far=90.0, anomalies=[anomaly], created_at=T0, updated_at=T0,
              last_checkpoint=CheckpointRef(step=600, uri="s3://x", committed_at=T0 + 5600),
              spec={"budget": {"max_total_cost": 500}})
    store.create_job(job)
    for attempt in (1, 2):
        for rank in (0, 1):
            store.put_node(Node(job_id="j-seen", node_id=f"a{attempt}-r{rank}", attempt=attempt, rank=rank,
                                instance_id=f"i-{attempt}{rank}", pool=POOL, state=NodeState.EXITED,
                                exit_code=75 if attempt == 1 else 0))
    for step in (400, 600):
        manifest = {"step": step, "created": T0 + step, "request_id": "n-1" if step == 400 else None,
                    "shards": [{"path": "a", "size": 2_000_000, "sha256": "0"}]}
        client("s3").put_object(Bucket=aws["bucket"], Key=f"checkpoints/j-seen/step-{step:08d}/manifest.json",
                                Body=json.dumps(manifest).encode())
    return job


def test_describe_and_cost_as_json_and_tables(aws: dict[str, str]) -> None:
    _job(aws)
    described = runner.invoke(app, ["describe", "j-seen", "--json"])
    assert described.exit_code == 0, described.output
    report = json.loads(described.stdout)
    assert [(a["number"], a["end_reason"], a["steps"], a["instances"]) for a in report["attempts"]] == [
        (1, "interrupted", 400, ["i-10", "i-11"]), (2, "succeeded", 200, ["i-20", "i-21"])]
    assert report["recoveries_detail"] == [{"after_attempt": 1, "reason": "interrupted", "stopped_at": T0 + 3600,
                                            "resumed_at": T0 + 3900, "downtime_s": 300.0, "resumed_from_step": 400}]
    assert [(c["step"], c["requested"], c["bytes"]) for c in report["checkpoints"]] == [
        (400, True, 2_000_000), (600, False, 2_000_000)]
    assert report["anomalies"][0]["kind"] == "non-finite" and report["attempts"][0]["exit_codes"] == {"0": 75, "1": 75}
    table = runner.invoke(app, ["describe", "j-seen"])
    assert table.exit_code == 0 and "interrupted" in table.output and "non-finite" in table.output
    costs = json.loads(runner.invoke(app, ["cost", "j-seen", "--json"]).stdout)
    assert costs["total"] == 90.0 and costs["budget"] == 500 and [ln["cost"] for ln in costs["lines"]] == [60.0, 30.0]
    assert costs["lines"][0]["hours"] == 1.0
    assert "total $90.00 of $500.00 budget" in runner.invoke(app, ["cost", "j-seen"]).output
    # spot savings as AWS counts them: the same 3 instance-hours at the catalog's p5 on-demand price
    od = catalog.on_demand_price("us-east-1", "p5.48xlarge")
    assert od is not None and costs["on_demand"] == pytest.approx(3 * od, abs=1e-3)
    assert [ln["on_demand_cost"] for ln in costs["lines"]] == pytest.approx([2 * od, od], abs=1e-3)
    assert costs["saved"] == pytest.approx(1 - 90.0 / (3 * od), abs=1e-3)
    assert f"cost $90.00 (saved {1 - 90.0 / (3 * od):.0%} against on-demand)" in " ".join(
        runner.invoke(app, ["describe", "j-seen"]).output.split())
    shown = " ".join(runner.invoke(app, ["cost", "j-seen"]).output.split())
    assert f"the same instance-hours on on-demand: ${3 * od:.2f} (saved {1 - 90.0 / (3 * od):.0%})" in shown
    assert "rebalance standbys" not in shown  # (a job without standbys has no such line)
    assert "not billed" not in shown  # (nor one EC2 billed in full)


def test_describe_advises_min_nodes_for_a_fixed_gang_that_keeps_restarting(aws: dict[str, str]) -> None:
    """Six 16-node spot gangs, each lost 26 minutes after its launch, 7.5 of them booting and restoring:
    describe says so, with the field that changes it (domain/advice.py); the job above (two attempts) gets
    no advice."""
    attempts = [Attempt(number=i + 1, pool=POOL, started_at=T0 + i * 1620, resumed_at=T0 + i * 1620 + 450,
                        ended_at=T0 + i * 1620 + 1560, end_reason="interrupted", nodes=16) for i in range(6)]
    DynamoDBJobStore().create_job(Job(job_id="j-storm", name="llm", status=JobStatus.RECOVERING, attempt=6,
                                      attempts=attempts, created_at=T0, updated_at=T0,
                                      spec={"resources": {"nodes": 16, "min_nodes": None}}))
    report = json.loads(runner.invoke(app, ["describe", "j-storm", "--json"]).stdout)
    assert len(report["advice"]) == 1 and "spent 29% of their time booting and restoring" in report["advice"][0]
    shown = " ".join(runner.invoke(app, ["describe", "j-storm"]).output.split())
    assert "advice: the last 6 spot gangs of 16 nodes" in shown and "resources.min_nodes" in shown
    _job(aws)
    assert json.loads(runner.invoke(app, ["describe", "j-seen", "--json"]).stdout)["advice"] == []


def test_cost_of_a_running_job_counts_its_open_attempt(aws: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The open attempt costs its clock so far (the figure the budget is checked against), not 0."""
    now = time.time()
    attempts = [Attempt(number=1, pool=POOL, started_at=now - 7200, ended_at=now - 3600, nodes=2,
                        price_per_hour=30.0, cost=60.0),
                Attempt(number=2, pool=POOL, started_at=now - 7200 + 5400, nodes=2, price_per_hour=30.0)]
    DynamoDBJobStore().create_job(Job(
        job_id="j-live", name="llm", status=JobStatus.RUNNING, attempt=2, attempts=attempts, cost_so_far=60.0,
        created_at=now - 7200, updated_at=now, budget_warned_at=now - 60, spec={"budget": {"max_total_cost": 100}}))
    costs = json.loads(runner.invoke(app, ["cost", "j-live", "--json"]).stdout)
    assert [ln["running"] for ln in costs["lines"]] == [False, True]
    described = json.loads(runner.invoke(app, ["describe", "j-live", "--json"]).stdout)
    assert [a["cost"] for a in described["attempts"]] == pytest.approx([ln["cost"] for ln in costs["lines"]], abs=0.1)
    assert costs["lines"][1]["cost"] == pytest.approx(30.0, abs=0.5)  # 2 nodes x $30/h x 30 min
    assert costs["total"] == pytest.approx(90.0, abs=0.5) and costs["budget_warned_at"] == pytest.approx(now - 60)
    table = " ".join(runner.invoke(app, ["cost", "j-live"]).output.split())
    assert "2 (running)" in table and "of $100.00 budget (90%); told it was nearly spent at" in table
    # $10 left at $60 an hour: 10 minutes
    assert costs["budget_spent_at"] == pytest.approx(now + 600, abs=5)
    assert "the budget is spent at" in table and "(in 0.2 h); the job stops then" in table
    listed = runner.invoke(app, ["jobs"]).output
    assert "90.0" in listed and "60.00" not in listed  # the list counts the running attempt too
    # a wide terminal: the module's console took its width when first imported (COLUMNS then), and
    # the attempts table wraps "running" at 80 columns
    monkeypatch.setattr(cli_main, "out", Console(width=200))
    shown = runner.invoke(app, ["status", "j-live"]).output
    assert "cost $90.0" in shown and "running" in shown and "30.0" in shown  # and status, its attempts too


def test_cost_status_and_jobs_count_a_closed_attempts_rank_still_draining(aws: dict[str, str],
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank of attempt 1 still finishing its save 30 minutes after the close (billed; the ledger charges
    it at its release): every view counts its $15 so far, as the budget sweep does."""
    now = time.time()
    attempts = [Attempt(number=1, pool=POOL, started_at=now - 7200, ended_at=now - 1800, nodes=2,
                        price_per_hour=30.0, cost=45.0),
                Attempt(number=2, pool=POOL, started_at=now - 1800, nodes=2, price_per_hour=30.0)]
    store = DynamoDBJobStore()
    store.create_job(Job(job_id="j-drain", name="llm", status=JobStatus.RUNNING, attempt=2, attempts=attempts,
                         cost_so_far=45.0, created_at=now - 7200, updated_at=now))
    store.put_node(Node(job_id="j-drain", node_id="a1-r1", attempt=1, rank=1, instance_id="i-11", pool=POOL,
                        state=NodeState.DOOMED, launched_at=now - 7200, release_after=now + 60))
    costs = json.loads(runner.invoke(app, ["cost", "j-drain", "--json"]).stdout)
    assert [(ln["cost"], ln["draining"]) for ln in costs["lines"]] == [(pytest.approx(60.0, abs=0.1), 1),
                                                                      (pytest.approx(30.0, abs=0.1), 0)]
    assert costs["total"] == pytest.approx(90.0, abs=0.1)
    monkeypatch.setattr(cli_inspect, "out", Console(width=200))  # (the table wraps at 80 columns)
    assert "1 (1 draining)" in " ".join(runner.invoke(app, ["cost", "j-drain"]).output.split())
    described = json.loads(runner.invoke(app, ["describe", "j-drain", "--json"]).stdout)
    assert described["cost"]["total"] == pytest.approx(90.0, abs=0.1)
    assert described["attempts"][0]["cost"] == pytest.approx(60.0, abs=0.1)
    row = next(line for line in runner.invoke(app, ["jobs"]).output.splitlines() if "j-drain" in line)
    assert "90.0" in row and f"{1 - 90.0 / (3 * catalog.on_demand_price('us-east-1', 'p5.48xlarge')):.0%}" in row
    monkeypatch.setattr(cli_main, "out", Console(width=200))
    assert "cost $90.0" in runner.invoke(app, ["status", "j-drain"]).output


def test_unknown_job_is_one_line(aws: dict[str, str]) -> None:
    for command in ("describe", "cost"):
        result = runner.invoke(app, [command, "no-such-job"])
        assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1, result.output
        assert result.output.startswith("error:") and "Traceback" not in result.output


def test_logs_from_the_twins_node_files(aws: dict[str, str], tmp_path: Path) -> None:
    for attempt, rank, text in ((1, 0, "a1 r0\n"), (2, 0, "step 1\nstep 2\n"), (2, 1, "r1 line\npartial")):
        node = tmp_path / "nodes" / f"j-seen-a{attempt}-r{rank}-i-0abc{attempt}{rank}"
        node.mkdir(parents=True)
        (node / f"train-a{attempt}.log").write_text(text)
    latest = runner.invoke(app, ["logs", "j-seen", "--dir", str(tmp_path)])
    assert latest.exit_code == 0, latest.output
    assert latest.stdout.splitlines() == ["[a2-r0] step 1", "[a2-r0] step 2", "[a2-r1] r1 line"]
    one = runner.invoke(app, ["logs", "j-seen", "--dir", str(tmp_path), "--attempt", "1", "--rank", "0", "--json"])
    assert [json.loads(line) for line in one.stdout.splitlines()] == [{"attempt": 1, "rank": 0, "line": "a1 r0"}]
    none = runner.invoke(app, ["logs", "j-other", "--dir", str(tmp_path)])
    assert none.exit_code == 1 and none.output.startswith("error: no training logs")



def test_logs_refuses_a_missing_dir_and_negative_numbers(aws: dict[str, str], tmp_path: Path) -> None:
    """A typo in --dir named as such (it read as "no training logs yet"); no attempt or rank below 0."""
    for args, says in ((["--dir", str(tmp_path / "nope")], "does not exist"),
                       (["--dir", str(tmp_path / "f")], "is a file"),
                       (["--attempt", "-1"], "'--attempt'"), (["--rank", "-2"], "'--rank'")):
        (tmp_path / "f").write_text("")
        result = runner.invoke(app, ["logs", "j-seen", *args])
        assert result.exit_code == 2 and says in result.output, result.output
        assert "Traceback" not in result.output

def test_logs_from_cloudwatch(aws: dict[str, str]) -> None:
    client("logs").create_log_group(logGroupName="/spotrelay/training")
    shipped = CloudWatchTrainingLogs("/spotrelay/training")
    now = int(time.time() * 1000)  # CloudWatch drops events older than 14 days
    shipped.put("j-seen", 1, 0, [(now, "hello"), (now + 1, "world")])
    shipped.put("j-seen", 1, 0, [(now + 2, "again")])
    result = runner.invoke(app, ["logs", "j-seen", "--rank", "0"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["hello", "world", "again"]


def test_cost_shows_what_rebalance_standbys_cost_on_a_line_of_their_own(aws: dict[str, str]) -> None:
    """A standby belongs to no attempt: the $4 of one released unused (in the ledger and the total) has
    its own line, and one standing by now is noted (it is charged when it is released or takes a rank)."""
    now = time.time()
    attempts = [Attempt(number=1, pool=POOL, started_at=now - 3600, nodes=2, price_per_hour=30.0)]
    store = DynamoDBJobStore()
    store.create_job(Job(job_id="j-standby", name="llm", status=JobStatus.RUNNING, attempt=1, attempts=attempts,
                         cost_so_far=4.0, standby_cost=4.0, created_at=now - 3600, updated_at=now))
    store.put_node(Node(job_id="j-standby", node_id="a1-r2", attempt=1, rank=2, instance_id="i-12", pool=POOL,
                        state=NodeState.READY, launched_at=now - 300, spare=True, release_after=now + 300))
    costs = json.loads(runner.invoke(app, ["cost", "j-standby", "--json"]).stdout)
    assert (costs["standby"], costs["standing_by"]) == (4.0, 1)
    assert costs["total"] == pytest.approx(64.0, abs=0.1)  # the open attempt's hour and the standby's $4
    shown = " ".join(runner.invoke(app, ["cost", "j-standby"]).output.split())
    assert "rebalance standbys: $4.00; 1 standing by, charged when released or when it takes a rank" in shown


def test_cost_says_what_ec2_did_not_bill(aws: dict[str, str]) -> None:
    """An attempt costs less than its price x nodes x hours when EC2 interrupted some of its instances in
    their first hour (not billed): the report says how much was left out, so the ledger reads as the bill."""
    now = time.time()
    closed = Attempt(number=1, pool=POOL, started_at=now - 3600, ended_at=now - 1800, nodes=2, price_per_hour=30.0,
                     cost=15.0, unbilled=15.0, end_reason="node-lost")
    store = DynamoDBJobStore()
    store.create_job(Job(job_id="j-unbilled", name="llm", status=JobStatus.SUCCEEDED, attempt=1, attempts=[closed],
                         cost_so_far=15.0, created_at=now - 3600, updated_at=now))
    costs = json.loads(runner.invoke(app, ["cost", "j-unbilled", "--json"]).stdout)
    assert costs["unbilled"] == 15.0 and costs["lines"][0]["unbilled"] == 15.0 and costs["total"] == 15.0
    shown = " ".join(runner.invoke(app, ["cost", "j-unbilled"]).output.split())
    assert "not billed: $15.00 of the attempts' clocks, instances EC2 interrupted in their first hour" in shown


def test_describe_cost_and_status_show_the_attempts_folded_out_of_the_record(aws: dict[str, str]) -> None:
    """A job past services/history.ATTEMPTS_KEPT attempts keeps the newest in full: the tables say how many
    came before and what they cost, and the totals count them."""
    from spotrelay.services.history import kept

    attempts = [Attempt(number=n, pool=POOL, started_at=T0 + n * 3600, ended_at=T0 + n * 3600 + 1800, nodes=2,
                        price_per_hour=30.0, cost=30.0, end_reason="interrupted") for n in range(1, 206)]
    newest, earlier = kept(attempts, None)
    store = DynamoDBJobStore()
    store.create_job(Job(job_id="j-long", name="llm", status=JobStatus.SUCCEEDED, attempt=205, attempts=newest,
                         earlier=earlier, cost_so_far=205 * 30.0, created_at=T0, updated_at=T0))
    costs = json.loads(runner.invoke(app, ["cost", "j-long", "--json"]).stdout)
    assert costs["earlier_attempts"] == 5 and costs["earlier_cost"] == 150.0 and len(costs["lines"]) == 200
    assert costs["on_demand"] == pytest.approx(205 * 30.0 / 30.0 * catalog.on_demand_price("us-east-1", "p5.48xlarge"))
    shown = " ".join(runner.invoke(app, ["cost", "j-long"]).output.split())
    assert "1-5 (folded)" in shown
    for command in ("describe", "status"):
        out = " ".join(runner.invoke(app, [command, "j-long"]).output.split())
        assert "and 5 earlier attempts ($150.00), folded out of the job record: it keeps the newest 200" in out, command
    status = " ".join(runner.invoke(app, ["status", "j-long"]).output.split())
    assert "and 190 earlier attempts in the job record (`spotrelay describe` and `spotrelay cost` list them)" in status
    assert "│ 205 │" in status and "│ 195 │" not in status  # the newest 10: 196-205


def test_status_lists_the_current_attempts_nodes_and_the_live_ones(aws: dict[str, str]) -> None:
    store = DynamoDBJobStore()
    store.create_job(Job(job_id="j-nodes", name="llm", status=JobStatus.RUNNING, attempt=3, created_at=T0,
                         updated_at=T0))
    now = time.time()
    for attempt, rank, state, spare, release in (
            (1, 0, NodeState.TERMINATED, False, None), (2, 0, NodeState.LOST, False, None),
            (2, 1, NodeState.EXITED, False, now - 60),  # its save done: ended
            (2, 3, NodeState.EXITED, False, now + 600),  # its trainer exited, its save still uploading
            (2, 2, NodeState.READY, True, None), (3, 0, NodeState.RUNNING, False, None)):
        store.put_node(Node(job_id="j-nodes", node_id=f"a{attempt}-r{rank}", attempt=attempt, rank=rank,
                            instance_id=f"i-{attempt}{rank}", pool=POOL, state=state, spare=spare,
                            release_after=release))
    out = runner.invoke(app, ["status", "j-nodes"]).output
    assert "a3-r0" in out and "a2-r2" in out and "a2-r3" in out
    assert "a1-r0" not in out and "a2-r0" not in out and "a2-r1" not in out
    assert "and 3 ended node records of earlier attempts (--json has them)" in out
    records = json.loads(runner.invoke(app, ["status", "j-nodes", "--json"]).stdout)["nodes"]
    assert len(records) == 6
