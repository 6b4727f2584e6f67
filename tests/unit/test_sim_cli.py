"""`spotrelay simulate`: the contract's JSON, the plot, one-line errors."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from spotrelay.cli.main import app
from spotrelay.sim.losses import CATEGORIES
from spotrelay.sim.runner import METRICS, POLICIES

TRACE = Path(__file__).resolve().parents[2] / "spotrelay" / "local" / "data" / "bamboo-g4dn-trace.csv"
HANG_S = 300.0  # a wait's bound that only catches a hang (a loaded CI machine may be slow, never this slow)


def test_simulate_writes_the_contracts_json_and_a_plot(tmp_path: Path) -> None:
    out, png = tmp_path / "sim.json", tmp_path / "sim.png"
    result = CliRunner().invoke(app, ["simulate", "--trace", str(TRACE), "--nodes", "4", "--job-hours", "3",
                                      "--seeds", "2", "--regions", "us-east-1,us-west-2", "--json", str(out),
                                      "--plot", str(png)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["nodes"] == 4 and doc["seeds"] == 2 and doc["trace"] == TRACE.name
    assert set(doc["policies"]) == set(POLICIES)
    for values in doc["policies"].values():
        assert set(values) == set(METRICS)
    limit, od = doc["policies"]["price-limit"], doc["policies"]["on-demand"]
    assert limit["captured_saving"] == 1.0 and od["captured_saving"] == 0.0
    assert od["on_demand_share"] == 1.0 and od["interruptions"] == 0
    assert 0 < doc["policies"]["spotrelay"]["goodput"] <= 1
    for policy, shares in doc["losses"].items():  # where paid GPU-hours went: every phase, summing to 1
        assert set(shares) == set(CATEGORIES)
        assert abs(sum(shares.values()) - 1.0) < 1e-3
        assert abs(shares["useful"] - doc["policies"][policy]["goodput"]) < 1e-6
    assert png.stat().st_size > 10_000
    assert "events/s" in result.output and "where paid GPU-hours went" in result.output
    # the result states its assumptions, on the terminal and in the file
    a = doc["assumptions"]
    assert a["times_s"]["boot"] == 300.0 and a["times_s"]["notice"] == 120.0
    assert a["market"]["price_source"] == "catalog"
    assert a["billing"] == {"per_second_from": "launch", "spot_interrupted_free_within_s": 3600.0,
                            "checkpoint_region": "us-east-1", "transfer_usd_per_gb": 0.0}
    assert a["times_s"]["restore"] > a["times_s"]["bringup"] and a["bandwidth_gb_per_s"]["s3_per_node"] > 0
    assert set(a["market"]["usd_per_node_hour"]) == {"p5.48xlarge", "p4d.24xlarge"} and a["job"]["nodes"] == 4
    assert "assumed: boot 300 s" in result.output and "prices USD per node-hour (catalog): p5.48xlarge" in result.output


def test_simulate_states_the_assumptions_its_flags_set(tmp_path: Path) -> None:
    out = tmp_path / "sim.json"
    result = CliRunner().invoke(app, ["simulate", "--trace", str(TRACE), "--nodes", "4", "--job-hours", "2",
                                      "--policies", "spotrelay,on-demand", "--boot-s", "45", "--on-demand-price",
                                      "3.06", "--spot-price", "0.91", "--json", str(out)])
    assert result.exit_code == 0, result.output
    a = json.loads(out.read_text())["assumptions"]
    assert a["times_s"]["boot"] == 45.0 and a["market"]["price_source"] == "flags"
    assert a["market"]["usd_per_node_hour"]["p5.48xlarge"] == {"on_demand": [3.06, 3.06], "spot": [0.91, 0.91]}
    assert "prices USD per node-hour (flags): p5.48xlarge on-demand 3.06, spot 0.91" in result.output
    # one instance type's boot instead of every type's (recovery/boot.py's p5 estimate)
    result = CliRunner().invoke(app, ["simulate", "--trace", str(TRACE), "--nodes", "4", "--job-hours", "2",
                                      "--policies", "spotrelay", "--boot-s-for", "p5.48xlarge=420", "--json", str(out)])
    assert result.exit_code == 0, result.output
    a = json.loads(out.read_text())["assumptions"]
    assert a["times_s"]["boot_by_type"] == {"p5.48xlarge": 420.0, "p4d.24xlarge": 300.0}
    assert "assumed: boot p5.48xlarge 420 s, p4d.24xlarge 300 s (+-15%)" in result.output


def test_simulate_takes_spot_up_to_on_demands_price(tmp_path: Path) -> None:
    """Spot at on-demand's price is the edge of a real market (the thin-discount study runs up to it); only
    above it is refused (test_simulate_refuses_values_that_cannot_run_naming_them)."""
    out = tmp_path / "sim.json"
    result = CliRunner().invoke(app, ["simulate", "--trace", str(TRACE), "--nodes", "4", "--job-hours", "2",
                                      "--policies", "on-demand,price-limit", "--on-demand-price", "3",
                                      "--spot-price", "3", "--json", str(out)])
    assert result.exit_code == 0, result.output
    prices = json.loads(out.read_text())["assumptions"]["market"]["usd_per_node_hour"]["p5.48xlarge"]
    assert prices == {"on_demand": [3.0, 3.0], "spot": [3.0, 3.0]}


def test_simulate_physics_flags_reach_the_run_and_its_assumptions(tmp_path: Path) -> None:
    """--s3-gbps, --unannounced-share, --rebalance-share: a result's sensitivity to its physics; the
    assumptions state what ran, and a slower restore costs goodput."""
    out = tmp_path / "sim.json"
    base = ["simulate", "--trace", str(TRACE), "--nodes", "8", "--job-hours", "24", "--policies",
            "spotrelay,on-demand", "--json", str(out)]
    assert CliRunner().invoke(app, base).exit_code == 0
    plain = json.loads(out.read_text())
    result = CliRunner().invoke(app, [*base, "--s3-gbps", "1", "--unannounced-share", "0.5", "--rebalance-share", "0"])
    assert result.exit_code == 0, result.output
    slow = json.loads(out.read_text())
    assert slow["assumptions"]["bandwidth_gb_per_s"]["s3_per_node"] == 1.0
    assert (slow["assumptions"]["market"]["unannounced_share"], slow["assumptions"]["market"]["rebalance_share"]) == (
        0.5, 0.0)
    assert slow["assumptions"]["times_s"]["restore"] > plain["assumptions"]["times_s"]["restore"]
    assert slow["policies"]["spotrelay"]["goodput"] < plain["policies"]["spotrelay"]["goodput"]
    assert "50% of reclaims unannounced, 0% with a rebalance" in result.output
    bad = CliRunner().invoke(app, [*base, "--unannounced-share", "1.5"])
    assert bad.exit_code == 2 and "--unannounced-share" in bad.output


def test_simulate_bad_input_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("10,add,a\n20,vanish,a\n")
    result = CliRunner().invoke(app, ["simulate", "--trace", str(bad)])
    assert result.exit_code == 2
    assert result.output.strip().count("\n") == 0 and f"{bad}:2" in result.output
    result = CliRunner().invoke(app, ["simulate", "--trace", str(TRACE), "--policies", "spotrelay,magic"])
    assert result.exit_code == 2 and "magic" in result.output
    result = CliRunner().invoke(app, ["simulate", "--trace", str(TRACE), "--switch", "sparez=1"])
    assert result.exit_code == 2 and result.output.strip().count("\n") == 0 and "sparez" in result.output
    # a value the spec refuses names the spec field, on one line
    result = CliRunner().invoke(app, ["simulate", "--trace", str(TRACE), "--nodes", "4", "--job-hours", "1",
                                      "--policies", "spotrelay", "--switch", "min_nodes=2",
                                      "--switch", "wall_time_weight=2"])
    assert result.exit_code == 2 and result.output.strip().count("\n") == 0, result.output
    assert "resources.wall_time_weight" in result.output


@pytest.mark.parametrize(("args", "named"), [
    (["--job-hours", "inf"], "--job-hours"),  # was an OverflowError
    (["--job-hours", "1e9"], "--job-hours"),  # would simulate for ever (the horizon is six times the job)
    (["--checkpoint-minutes", "inf"], "--checkpoint-minutes"),  # was a ZeroDivisionError
    (["--boot-s", "inf"], "--boot-s"),
    (["--boot-s", "nan"], "'--boot-s': nan is not a number from 0 to 86400"),  # was "should be less than or equal"
    (["--boot-s", "abc"], "'--boot-s': 'abc' is not a number"),
    (["--s3-gbps", "nan"], "'--s3-gbps': nan is not a number from 0.01 to 1000"),
    (["--unannounced-share", "-0.1"], "'--unannounced-share': -0.1 is not a number from 0 to 1"),
    (["--on-demand-price", "inf"], "--on-demand-price"),
    (["--spot-price", "nan"], "--spot-price"),
    (["--spot-price", "0"], "--spot-price 0: a price must be above 0"),  # every pool tied, captured 1.0 for all
    (["--on-demand-price", "0"], "--on-demand-price 0: a price must be above 0"),
    # spot above on-demand is no market EC2 runs (price-limit, the bound, cost more than on-demand)
    (["--spot-price", "40"], "--spot-price 40: spot at 40 USD per node-hour is above p4d.24xlarge's on-demand"),
    (["--on-demand-price", "10"], "--on-demand-price 10: spot at 22.016 USD per node-hour is above p5.48xlarge's"),
    (["--on-demand-price", "3", "--spot-price", "3.5"], "--spot-price 3.5 --on-demand-price 3: spot at 3.5"),
    (["--regions", "us-east-1,mars-1"], "'mars-1'"),
    (["--trace-format", "synthetic"], "synthetic reads no file"),  # the --trace was silently not read
    (["--trace-format", "pools-csv", "--spot-price", "1"], "--spot-price: a pools CSV prices each slot"),
    (["--trace", "p5.48xlarge=" + str(TRACE)], "'p5.48xlarge' matches no spot pool"),  # a typo drove nothing
    (["--trace", "us-east-1/*=" + str(TRACE), "--trace", "us-east-1/us-east-1a/*=" + str(TRACE)],
     "'us-east-1/us-east-1a/*' matches is taken by an earlier --trace ('us-east-1/*'"),  # was silently unread
    (["--trace", "*/p5.48xlarge=" + str(TRACE), "--trace", "*/p5.48xlarge/spot=" + str(TRACE)],
     "drives no pool"),  # the same pools twice
    (["--trace", "us-east-1/*="], "expected POOL=FILE"),  # was ".: cannot read the trace (Is a directory)"
    (["--instance-types", "p5.48xlarge,g9.huge"], "'g9.huge'"),
    (["--boot-s-for", "g9.huge=30"], "'g9.huge' is not an instance type of this run"),  # a typo did nothing
    (["--boot-s-for", "p5.48xlarge"], "expected TYPE=SECONDS"),
    (["--boot-s-for", "p5.48xlarge=-1"], "a boot takes 0 to 86400 s"),
    (["--policies", ","], "--policies names nothing"),  # ran no policy and exited 0
    (["--policies", ""], "--policies names nothing"),
    (["--regions", ""], "--regions names nothing"),
    (["--strategy", ""], "'--strategy': '' is not a recovery strategy"),  # silently the spec's default
    (["--strategy", " "], "'--strategy': ' ' is not a recovery strategy"),  # named "switch strategy", not the option
    (["--strategy", "replace-all"], "'--strategy': 'replace-all' is not a recovery strategy (replace-cluster or"),
    (["--switch", "strategy="], "switch strategy: recovery.strategy: Input should be"),  # silently the default
    (["--variant", "a:strategy="], "--variant a: switch strategy: recovery.strategy: Input should be"),
    (["--trace", ""], "--trace names nothing"),  # was ".: cannot read the trace (Is a directory)"
    (["--trace", " "], "--trace names nothing"),
    (["--spec", ""], "'--spec': '' names no file"),  # was "--spec .: has no suffix"
    (["--json", ""], "'--json': '' names no file"),  # was "--json .: is a directory"
    (["--plot", " "], "'--plot': ' ' names no file"),  # wrote a PNG named " .png" and said "wrote  "
    (["--regions", " , "], "--regions names nothing"),  # silently every default region
    (["--instance-types", ""], "--instance-types names nothing"),
    (["--instance-types", "p5e.48xlarge", "--regions", "us-west-2"], "no p5e.48xlarge in us-west-2"),
    (["--seeds", "1000000000"], "--seeds"),  # filled memory with its tasks, never printing a line
    (["--seeds", "60000", "--jobs", "2"], "--seeds 60000 x --jobs 2 x 1 policy is 120,000 runs; at most 100,000"),
    (["--jobs", "1000000000"], "--jobs"),
    (["--workers", "100000"], "--workers"),  # a process per run
    (["--switch", "max_hops=true"], "switch max_hops: max_hops: expected a number, got true"),  # was 1
    (["--switch", "heartbeat_s=false"], "heartbeat_s: expected a number, got false"),  # was 0
    (["--switch", "max_hops=0"], "max_hops: Input should be greater than or equal to 1"),
    # checked when the run is made: "1 validation error for RecoveryContext" at its first recovery, no switch named
    (["--switch", "keep_margin=nan"], "switch keep_margin: keep_margin: Input should be a finite number"),
    (["--switch", "keep_margin=-1"], "switch keep_margin: keep_margin: Input should be greater than or equal to 0"),
    (["--switch", "rebalance_checkpoint=maybe"], "rebalance_checkpoint: Input should be a valid boolean"),  # ran
])
def test_simulate_refuses_values_that_cannot_run_naming_them(args: list[str], named: str) -> None:
    """Hostile numbers and names end in one line naming the option or the value, exit 2, before any run."""
    result = CliRunner().invoke(app, ["simulate", "--trace", str(TRACE), "--nodes", "4", "--job-hours", "1",
                                      "--policies", "spotrelay", *args])
    assert result.exit_code == 2, result.output
    assert result.output.strip().count("\n") == 0 and named in result.output, result.output
    assert "unexpected" not in result.output  # a refusal, not an internal error


@pytest.mark.parametrize(("option", "name", "named"), [
    ("--json", "blocker/x.json", "cannot be written"),  # its folder would be a file
    ("--plot", "sim.txt", "format '.txt' is not one matplotlib writes"),
    ("--plot", "sim.", "names no format; end it in .png"),  # matplotlib wrote sim.png; it said "wrote sim."
    ("--plot", "sim", "names no format; end it in .png"),
    ("--json", "", "is a directory"),
    ("--json", "x" * 300 + ".json", "cannot be written (File name too long)"),  # (the option was not named)
])
def test_simulate_checks_its_output_paths_before_it_runs(tmp_path: Path, option: str, name: str, named: str) -> None:
    """A path that cannot take the output is refused in one line before the sweep runs (it used to fail
    after the whole run), and nothing is left behind."""
    (tmp_path / "blocker").write_text("a file, not a folder")
    path = tmp_path / name
    before = sorted(tmp_path.iterdir())
    result = CliRunner().invoke(app, ["simulate", "--trace", str(TRACE), "--nodes", "4", "--job-hours", "1",
                                      "--policies", "spotrelay", option, str(path)])
    assert result.exit_code == 2, result.output
    assert result.output.strip().count("\n") == 0 and named in result.output and option in result.output
    assert "events" not in result.output  # refused before any run
    assert sorted(tmp_path.iterdir()) == before


@pytest.mark.parametrize("option", ["--json", "--plot"])
def test_simulate_refuses_an_output_path_that_ends_in_a_slash(tmp_path: Path, option: str) -> None:
    """`--plot a.png/` names a folder: Path dropped the slash and a.png was written beside it."""
    given = f"{tmp_path}/out.{'png' if option == '--plot' else 'json'}/"
    result = CliRunner().invoke(app, ["simulate", "--trace", str(TRACE), "--nodes", "4", "--job-hours", "1",
                                      "--policies", "spotrelay", option, given])
    assert result.exit_code == 2, result.output
    assert result.output.strip().count("\n") == 0, result.output
    assert f"'{option}': '{given}' ends in a slash: it names a folder" in result.output, result.output
    assert list(tmp_path.iterdir()) == []  # refused before the run: nothing written


def test_simulate_writes_its_json_into_a_named_pipe_a_reader_waits_on(tmp_path: Path) -> None:
    """The output check opened a FIFO to probe it: it waited there for a reader (for ever, with none), and
    with one its close ended the reader's input, so the JSON, written after the runs, waited for ever."""
    pipe = tmp_path / "sim.json"
    os.mkfifo(pipe)
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(pipe.read_text()), daemon=True)
    reader.start()
    done: list[int] = []
    sim = threading.Thread(target=lambda: done.append(CliRunner().invoke(app, [
        "simulate", "--trace", str(TRACE), "--nodes", "4", "--job-hours", "1", "--policies", "spotrelay",
        "--json", str(pipe)]).exit_code), daemon=True)
    sim.start()
    for thread in (sim, reader):
        thread.join(HANG_S)
    assert done == [0] and got and "spotrelay" in json.loads(got[0])["policies"], (done, got)


def test_simulate_switches_reach_spotrelays_spec(tmp_path: Path) -> None:
    out = tmp_path / "sim.json"
    args = ["simulate", "--trace", str(TRACE), "--nodes", "4", "--job-hours", "2", "--policies", "spotrelay",
            "--regions", "us-east-1", "--json", str(out)]
    plain = CliRunner().invoke(app, args)
    assert plain.exit_code == 0, plain.output
    cost = json.loads(out.read_text())["policies"]["spotrelay"]["cost_usd"]
    spared = CliRunner().invoke(app, [*args, "--switch", "spares=2", "--switch", "launch_at_notice=false"])
    assert spared.exit_code == 0, spared.output
    assert json.loads(out.read_text())["policies"]["spotrelay"]["cost_usd"] > cost  # two more nodes billed


@pytest.mark.parametrize(("value", "taken"), [("false", False), ("off", False), ("0", False), ("true", True)])
def test_rebalance_checkpoint_switch_reads_a_word_as_a_boolean(value: str, taken: bool) -> None:
    """Any word was taken as it was, and so as true: `rebalance_checkpoint=off` ran with the checkpoint."""
    from spotrelay.sim.build import MarketOptions, build_market
    from spotrelay.sim.job import JobModel
    from spotrelay.sim.runner import SimOptions, make_run, parse_switch

    opts = SimOptions(market=MarketOptions(traces=[str(TRACE)]), job=JobModel(nodes=8, job_hours=1),
                      policies=("spotrelay",), spotrelay_switches=dict([parse_switch(f"rebalance_checkpoint={value}")]))
    run = make_run("spotrelay", opts, build_market(opts.market, 0), 0, 0.0)
    assert run.rebalance_checkpoint is taken  # type: ignore[attr-defined]
    run.dispose()


@pytest.mark.parametrize("name", ["[bold]x.csv", "a\nb.csv"])
def test_a_trace_name_is_shown_whole_and_as_written(tmp_path: Path, name: str) -> None:
    """The line was cut at a newline in the name ("error: a") and rich read [bold] in it as markup."""
    result = CliRunner().invoke(app, ["simulate", "--trace", str(tmp_path / name)])
    shown = " ".join(str(tmp_path / name).split())
    assert result.exit_code == 2 and result.output == f"error: {shown}: cannot read the trace (No such file or " \
        "directory)\n", result.output


def test_simulate_timing_switches_reach_the_workflow() -> None:
    # the execution's input (WorkflowTimings) is sweepable: GatherLosses' wait, the backoff, ...
    from spotrelay.sim.build import MarketOptions, build_market
    from spotrelay.sim.job import JobModel
    from spotrelay.sim.runner import SimOptions, make_run, parse_switch

    def first_recovery(switch: str) -> float:
        opts = SimOptions(market=MarketOptions(traces=[str(TRACE)]), job=JobModel(nodes=8, job_hours=24),
                          policies=("spotrelay",), spotrelay_switches=dict([parse_switch(switch)]), timeline=True)
        run = make_run("spotrelay", opts, build_market(opts.market, 0), 0, 0.0)
        run.start()  # type: ignore[attr-defined]
        run.loop()
        assert run.metrics.finished
        return next(t for t, _, what in run.metrics.timeline if what.startswith("recover:"))

    # the same history up to the first loss; Recover runs loss_settle_s after it
    assert first_recovery("loss_settle_s=60") - first_recovery("loss_settle_s=0") == pytest.approx(60.0)
    for bad in ("-1", "100000000"):  # (past what a Step Functions Wait holds: the execution would fail there)
        result = CliRunner().invoke(app, ["simulate", "--trace", str(TRACE), "--nodes", "4", "--job-hours", "1",
                                          "--policies", "spotrelay", "--switch", f"loss_settle_s={bad}"])
        assert result.exit_code == 2 and result.output.strip().count("\n") == 0, result.output
        assert "switch loss_settle_s" in result.output
    with pytest.raises(ValueError, match="time_scale"):  # the twin's clock is not a simulator switch
        parse_switch("time_scale=2")


def test_simulate_says_which_runs_did_not_finish_and_why() -> None:
    """No g4dn pool ever holds 32 nodes: the relaunching baselines never start. The table shows their
    cost as "-", and a warning names them and the reason (a failed run's means are not a result)."""
    result = CliRunner().invoke(app, ["simulate", "--trace", str(TRACE), "--nodes", "32", "--job-hours", "1",
                                      "--policies", "spotrelay,on-demand,skypilot-like,price-limit"])
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    assert "skypilot-like: 1 of 1 run(s) did not finish (no pool skypilot-like may use ever holds 32 nodes)" in out
    assert "spotrelay: " not in out.split("where paid GPU-hours went")[0]  # it finished: no warning


def _spec_file(tmp_path: Path, **resources: object) -> Path:
    doc = {"version": 1, "name": "my-llm", "entrypoint": {"command": ["python", "train.py"]},
           "resources": {"nodes": 6, "regions": ["us-east-1", "us-west-2"], "instance_types": ["p4d.24xlarge"],
                         **resources},
           "checkpoint": {"every_minutes": "auto"}}
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(doc))  # (JSON is YAML)
    return path


def test_simulate_runs_the_users_spec(tmp_path: Path) -> None:
    """``--spec``: spotrelay decides with the user's spec (its sizes, places, markets and cadence)."""
    out = tmp_path / "sim.json"
    spec = _spec_file(tmp_path, markets=["on-demand"])
    result = CliRunner().invoke(app, ["simulate", "--trace", str(TRACE), "--spec", str(spec), "--job-hours", "3",
                                      "--policies", "spotrelay,on-demand,price-limit", "--json", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    a = doc["assumptions"]
    assert doc["nodes"] == 6 and a["market"]["regions"] == ["us-east-1", "us-west-2"]
    assert a["market"]["instance_types"] == ["p4d.24xlarge"] and a["job"]["checkpoint_minutes"] == 30.0
    assert a["spotrelay"]["spec"]["name"] == "my-llm"
    assert doc["policies"]["spotrelay"]["on_demand_share"] == 1.0  # the spec allows on-demand only
    assert "spotrelay ran spec 'my-llm'" in result.output
    # the same without the market restriction runs on spot
    spot = _spec_file(tmp_path)
    result = CliRunner().invoke(app, ["simulate", "--trace", str(TRACE), "--spec", str(spot), "--job-hours", "3",
                                      "--policies", "spotrelay,on-demand,price-limit", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["policies"]["spotrelay"]["on_demand_share"] < 1.0


@pytest.mark.parametrize(("extra", "resources", "expected"), [
    (["--nodes", "8"], {}, "--spec states the job: leave out --nodes"),
    (["--regions", "us-east-1", "--checkpoint-minutes", "5"], {}, "leave out --regions, --checkpoint-minutes"),
    ([], {"nodes": 0}, "resources.nodes"),
    ([], {"regions": ["eu-north-1"]}, "resources.regions: unknown region 'eu-north-1'"),
])
def test_simulate_spec_errors_name_the_flag_or_the_field(tmp_path: Path, extra: list[str],
                                                         resources: dict[str, object], expected: str) -> None:
    spec = _spec_file(tmp_path, **resources)
    result = CliRunner().invoke(app, ["simulate", "--trace", str(TRACE), "--spec", str(spec), "--job-hours", "1",
                                      *extra])
    assert result.exit_code == 2 and expected in result.output, result.output
    assert "Traceback" not in result.output


def test_simulate_takes_your_models_checkpoint_size_and_step_time(tmp_path: Path) -> None:
    out = tmp_path / "sim.json"
    base = ["simulate", "--trace", str(TRACE), "--nodes", "4", "--job-hours", "2", "--policies", "spotrelay",
            "--json", str(out)]
    assert CliRunner().invoke(app, base).exit_code == 0
    stated = json.loads(out.read_text())["assumptions"]
    result = CliRunner().invoke(app, [*base, "--checkpoint-gb", "112", "--step-s", "4"])
    assert result.exit_code == 0, result.output
    a = json.loads(out.read_text())["assumptions"]
    assert a["job"]["step_s"]["p5.48xlarge"] == 4.0 and a["job"]["checkpoint_gb_per_node"] == 28.0
    assert a["times_s"]["restore"] < stated["times_s"]["restore"]  # a tenth of the bytes to load
    assert a["job"]["total_steps"] == 2 * 3600 / 4
    bad = CliRunner().invoke(app, [*base, "--step-s", "0"])
    assert bad.exit_code == 2 and "--step-s" in bad.output


def test_a_policy_that_never_launched_says_so_where_the_paid_hours_went(tmp_path: Path) -> None:
    one = tmp_path / "one.csv"
    one.write_text("ms,add|remove,node\n0,add,a\n")  # one spot node: no baseline's 2-node gang ever fits
    result = CliRunner().invoke(app, ["simulate", "--trace", str(one), "--nodes", "2", "--job-hours", "1"])
    assert result.exit_code == 0, result.output
    assert "skypilot-like: nothing paid (no gang ever launched)" in result.output
    assert "on-demand: useful 0." in result.output  # (it paid: its shares)


def test_a_trace_whose_path_holds_an_equals_sign_is_a_file(
        tmp_path: Path) -> None:
    """``--trace runs/lr=0.1/trace.csv`` was read as POOL=FILE (pool ``runs/lr``, file ``0.1/trace.csv``)."""
    folder = tmp_path / "lr=0.1"
    folder.mkdir()
    trace = folder / "trace.csv"
    trace.write_bytes(TRACE.read_bytes())
    out = tmp_path / "sim.json"
    result = CliRunner().invoke(app, ["simulate", "--trace", str(trace), "--nodes", "4", "--job-hours", "1",
                                      "--policies", "spotrelay,on-demand,spotrelay", "--json", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["trace"] == "trace.csv" and sorted(report["policies"]) == ["on-demand", "spotrelay"]
    assert report["policies"]["spotrelay"]["cost_usd"] > 0
    missing = CliRunner().invoke(app, ["simulate", "--trace", f"{tmp_path}/nowhere=x.csv", "--nodes", "4"])
    assert missing.exit_code == 2 and "x.csv" in missing.output  # not a file: still POOL=FILE, named


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (a file whose writes fail)")
def test_an_output_that_fails_after_the_run_is_named_in_one_line() -> None:
    """check_writable passes /dev/full (it opens, it exists); the write after the run failed with a bare
    "No space left on device" that named no option and no file."""
    result = CliRunner().invoke(app, ["simulate", "--trace", str(TRACE), "--nodes", "4", "--job-hours", "1",
                                      "--policies", "spotrelay", "--json", "/dev/full"])
    assert result.exit_code == 2, result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("error: --json /dev/full: cannot be written (No space left on device)"), last
    assert "spotrelay" in result.output  # the table came first
