"""``spotrelay simulate --variant NAME:SWITCH=VALUE,...``: spotrelay with other switches beside it on the
same markets and seeds (spotrelay/sim/variants.py), each the same runs as ``--switch`` would give alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from spotrelay.cli.main import app
from spotrelay.sim.build import MarketOptions
from spotrelay.sim.job import JobModel
from spotrelay.sim.report import timeline_run
from spotrelay.sim.runner import SimOptions, simulate
from spotrelay.sim.variants import parse_variant, parse_variants, with_variants

MARKET = MarketOptions(trace_format="synthetic", regions=["us-east-1", "us-west-2"])
ARGS = ["simulate", "--trace-format", "synthetic", "--nodes", "16", "--job-hours", "48", "--seeds", "2",
        "--regions", "us-east-1,us-west-2"]


def _opts(**kw: object) -> SimOptions:
    return SimOptions(market=MARKET, job=JobModel(nodes=16, job_hours=48.0), seeds=2, **kw)  # type: ignore[arg-type]


def test_a_variant_runs_what_its_switches_run_alone_and_spotrelay_what_it_runs_without_it() -> None:
    variants = {"spotrelay:lean": {"spares": 1, "launch_at_notice": False}}
    both = simulate(_opts(policies=with_variants(("spotrelay", "on-demand", "price-limit"), variants),
                          variants=variants, spotrelay_switches={"every_minutes": "auto"}))
    alone = simulate(_opts(policies=("spotrelay", "on-demand", "price-limit"),
                           spotrelay_switches={"every_minutes": "auto", "spares": 1, "launch_at_notice": False}))
    plain = simulate(_opts(policies=("spotrelay", "on-demand", "price-limit"),
                           spotrelay_switches={"every_minutes": "auto"}))
    assert both.policies() == ["spotrelay", "spotrelay:lean", "on-demand", "price-limit"]
    for seed in range(2):
        got = {r.policy: r for r in both.runs if r.seed == seed}
        assert got["spotrelay:lean"].values == next(r for r in alone.runs if r.seed == seed
                                                    and r.policy == "spotrelay").values
        assert got["spotrelay"].values == next(r for r in plain.runs if r.seed == seed
                                               and r.policy == "spotrelay").values
    spares_paid = both.loss("spotrelay:lean", "spare")
    assert spares_paid > 0 and not both.loss("spotrelay", "spare") > 0  # (the switch reached the variant only)
    ratios = [v / b for v, b in zip(both.series("spotrelay:lean", "cost_per_useful_gpu_hour"),
                                    both.series("spotrelay", "cost_per_useful_gpu_hour"), strict=True)]
    assert both.vs_spotrelay("spotrelay:lean") == pytest.approx(sum(ratios) / 2, rel=1e-12)
    doc = both.to_json()
    assert doc["relative"]["spotrelay:lean"]["vs_spotrelay"] == round(sum(ratios) / 2, 6)
    assert "vs_spotrelay" not in doc["relative"]["spotrelay"]  # (the contract's keys for the five policies)
    assert doc["assumptions"]["variants"] == {"spotrelay:lean": {"launch_at_notice": False, "spares": 1}}


def test_the_cli_shows_each_variant_against_spotrelay_and_writes_it(tmp_path: Path) -> None:
    out = tmp_path / "v.json"
    result = CliRunner().invoke(app, [*ARGS, "--policies", "spotrelay,on-demand,price-limit", "--variant",
                                      "elastic:min_nodes=8", "--variant", "spared:spares=1", "--json", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert list(doc["policies"]) == ["spotrelay", "spotrelay:elastic", "spotrelay:spared", "on-demand",
                                     "price-limit"]
    spared = doc["relative"]["spotrelay:spared"]["vs_spotrelay"]
    assert f"spotrelay:spared: {spared:.3f}x spotrelay's cost per useful GPU-hour" in result.output
    assert "spotrelay:elastic min_nodes=8; spotrelay:spared spares=1" in result.output  # (the assumptions)


def test_variants_over_workers_write_what_one_process_writes(tmp_path: Path) -> None:
    docs = []
    for workers in ("1", "2"):
        out = tmp_path / f"w{workers}.json"
        result = CliRunner().invoke(app, [*ARGS, "--jobs", "2", "--variant", "elastic:min_nodes=8,spares=1",
                                          "--workers", workers, "--json", str(out)])
        assert result.exit_code == 0, result.output
        docs.append(out.read_bytes())
    assert docs[0] == docs[1]


@pytest.mark.parametrize(("given", "said"), [
    (["x"], "--variant 'x': expected NAME:SWITCH=VALUE[,SWITCH=VALUE...], NAME of lower-case letters"),
    ([":min_nodes=8"], "--variant ':min_nodes=8': expected NAME:"),
    (["Big Name:min_nodes=8"], "--variant 'Big Name:min_nodes=8': expected NAME:"),
    (["e:"], "--variant 'e:': no switch (expected NAME:SWITCH=VALUE[,SWITCH=VALUE...])"),
    (["e: , ,"], "--variant 'e: , ,': no switch"),
    (["e:bogus=1"], "--variant e: --switch 'bogus=1': expected NAME=VALUE with NAME one of strategy"),
    (["e:min_nodes=8,min_nodes=4"], "--variant e: switch min_nodes given twice"),
    (["e:min_nodes=8", "e:spares=1"], "--variant e given twice"),
    (["e:spares=-1"], "--variant e: switch spares: resources.spares:"),
    (["e:min_nodes=99"], "--variant e: switch min_nodes: resources: min_nodes 99 is more than nodes 16"),
    ([f"v{i}:spares=1" for i in range(17)], "--variant given 17 times: at most 16 in one call"),
])
def test_a_bad_variant_is_one_line_naming_it_before_any_run(given: list[str], said: str, tmp_path: Path) -> None:
    out = tmp_path / "never.json"
    args = [*ARGS, "--job-hours", "50000"]  # (a sweep this long shows a refusal came before any run)
    for text in given:
        args += ["--variant", text]
    result = CliRunner().invoke(app, [*args, "--json", str(out)])
    assert result.exit_code == 2, result.output
    assert result.output.startswith(f"error: {said}"), result.output
    assert len(result.output.strip().splitlines()) == 1 and not out.exists()


def test_parse_variant_values_are_json_where_they_parse() -> None:
    assert parse_variant("a.b-c_1: spares=1, every_minutes=auto ,rebalance_checkpoint=false") == (
        "spotrelay:a.b-c_1", {"spares": 1, "every_minutes": "auto", "rebalance_checkpoint": False})
    assert parse_variants([]) == {}
    assert with_variants(("on-demand", "price-limit"), {"spotrelay:x": {}}) == ("spotrelay:x", "on-demand",
                                                                                "price-limit")


def test_the_plots_timeline_is_spotrelays_else_a_variants_else_the_first_policys() -> None:
    variants = {"spotrelay:lean": {"spares": 1}}
    for policies, drawn in ((("on-demand", "spotrelay", "spotrelay:lean"), "spotrelay"),
                            (("on-demand", "spotrelay:lean"), "spotrelay:lean"), (("price-limit", "on-demand"),
                                                                                  "price-limit")):
        report = simulate(_opts(policies=policies, variants=variants, timeline=True))
        run = timeline_run(report)
        assert run is not None and run.policy == drawn and run.seed == 0 and run.timeline
    assert timeline_run(simulate(_opts(policies=("on-demand",)))) is None  # (no --plot: no timeline kept)
