"""domain/advice.py: a fixed gang whose spot restarts cost a fifth of its time or more is told about
``resources.min_nodes``, from its own attempts' launch, resume and end times; nothing else is."""

from __future__ import annotations

import math
from typing import Any

import pytest

from spotrelay.domain.advice import (
    BRING_UP_SHARE,
    LOOKBACK,
    MIN_GANGS,
    bring_up_share,
    elastic_advice,
    job_advice,
    notice_advice,
)
from spotrelay.domain.models import Attempt, Pool

SPOT = Pool(region="us-east-1", az="us-east-1a", instance_type="p5.48xlarge", market="spot")
ON_DEMAND = SPOT.model_copy(update={"market": "on-demand"})
FIXED = {"resources": {"nodes": 16}}


def gangs(n: int, up_s: float = 450.0, life_s: float = 1560.0, pool: Pool = SPOT, reason: str = "interrupted",
          first: int = 1) -> list[Attempt]:
    """``n`` attempts back to back, each ``life_s`` long, training ``up_s`` after its launch."""
    out, t = [], 1_764_000_000.0
    for i in range(n):
        out.append(Attempt(number=first + i, pool=pool, started_at=t, resumed_at=t + up_s, ended_at=t + life_s,
                           end_reason=reason, nodes=16))
        t += life_s + 60.0
    return out


def test_a_fixed_gang_restarting_every_26_minutes_is_told_with_its_own_figures() -> None:
    # the simulator's fixed gang on the g4dn trace at 16 nodes: boot and restore 7.5 min of every ~26
    line = elastic_advice(FIXED, gangs(6))
    assert line is not None
    assert "last 6 spot gangs of 16 nodes spent 29% of their time booting and restoring" in line
    assert "26 min on average" in line and "resources.min_nodes" in line
    assert line.endswith("`spotrelay simulate --spec JOB.yaml --variant elastic:min_nodes=8` shows it beside "
                         "the fixed gang first)")
    share, count, life = bring_up_share(gangs(6)) or (0.0, 0, 0.0)
    assert share == pytest.approx(450 / 1560) and count == 6 and life == pytest.approx(1560.0)


@pytest.mark.parametrize("spec", [
    {"resources": {"nodes": 16, "min_nodes": 8}},  # elastic already
    {"resources": {"nodes": 1}},  # nothing to shrink to
    {"resources": {"nodes": "16"}}, {"resources": {"nodes": True}}, {"resources": [16]}, {"resources": None},
    {"resources": {"nodes": 16, "min_nodes": "8"}}, {}, None,  # records this release cannot read: no advice
])
def test_no_advice_for_an_elastic_single_node_or_unreadable_spec(spec: Any) -> None:
    assert elastic_advice(spec, gangs(6)) is None


def test_a_stated_min_nodes_equal_to_nodes_is_a_fixed_gang() -> None:
    assert elastic_advice({"resources": {"nodes": 16, "min_nodes": 16}}, gangs(6)) is not None


def test_no_advice_below_the_share_with_few_gangs_or_for_gangs_no_loss_ended() -> None:
    long_lived = gangs(6, up_s=450.0, life_s=450.0 / (BRING_UP_SHARE * 0.99))  # just under a fifth
    assert elastic_advice(FIXED, long_lived) is None
    assert elastic_advice(FIXED, gangs(6, up_s=450.0, life_s=450.0 / BRING_UP_SHARE)) is not None  # at it
    assert elastic_advice(FIXED, gangs(MIN_GANGS - 1)) is None
    assert elastic_advice(FIXED, gangs(6, pool=ON_DEMAND)) is None  # on-demand is never taken back
    for reason in ("migrate", "succeeded", "cancelled", "user-error"):
        assert elastic_advice(FIXED, gangs(6, reason=reason)) is None


@pytest.mark.parametrize("reason", ["interrupted", "node-lost", "ready-timeout", "heartbeat-timeout", "infra-error"])
def test_every_loss_counts_an_infrastructure_failure_too(reason: str) -> None:
    # a gang a bad node or a broken network ended restarts whole like a reclaimed one (the review reads
    # its end as a loss too: contracts/recovery.gang_lost)
    assert elastic_advice(FIXED, gangs(6, reason=reason)) is not None


def test_only_the_newest_attempts_count_and_a_gang_lost_before_it_trained_counts_whole() -> None:
    old_storm = gangs(LOOKBACK)  # long ago, then the job settled into a pool that holds it
    calm = gangs(LOOKBACK, up_s=450.0, life_s=8 * 3600.0, first=LOOKBACK + 1)
    assert elastic_advice(FIXED, old_storm + calm) is None
    never = [a.model_copy(update={"resumed_at": None}) for a in gangs(2, up_s=0.0, life_s=600.0)]
    share = bring_up_share(gangs(2, up_s=450.0, life_s=1800.0) + never)
    assert share is not None and share[0] == pytest.approx((2 * 450 + 2 * 600) / (2 * 1800 + 2 * 600))


def test_a_record_without_resume_times_gets_no_advice() -> None:
    """An older release's attempts have no ``resumed_at``: every gang would look all bring-up."""
    assert elastic_advice(FIXED, [a.model_copy(update={"resumed_at": None}) for a in gangs(6)]) is None


def test_open_or_inconsistent_attempts_are_left_out() -> None:
    bad = gangs(6)
    bad[0] = bad[0].model_copy(update={"ended_at": None, "end_reason": None})  # still running
    bad[1] = bad[1].model_copy(update={"ended_at": (bad[1].started_at or 0.0) - 5})  # ended before it started
    measured = bring_up_share(bad)
    assert measured is not None and measured[1] == 4
    bad[2] = bad[2].model_copy(update={"ended_at": math.inf})
    bad[3] = bad[3].model_copy(update={"resumed_at": math.nan})
    assert bring_up_share(bad) is None  # (two left: too few to say anything)
    measured = bring_up_share(gangs(4) + bad)  # (the 4 + 2 others)
    assert measured is not None and measured[0] == pytest.approx(450 / 1560)  # never a NaN share


def _simulated_attempts(nodes: int) -> tuple[dict[str, Any], list[Attempt]]:
    """The job record's attempts after 48 h of the shipped fixed gang on the g4dn trace (the simulator
    keeps them as the services do: launch, resume, end and its reason)."""
    from pathlib import Path

    from spotrelay.sim.build import MarketOptions, build_market
    from spotrelay.sim.job import JobModel
    from spotrelay.sim.runner import SimOptions, make_run

    trace = Path(__file__).resolve().parents[2] / "spotrelay" / "local" / "data" / "bamboo-g4dn-trace.csv"
    opts = SimOptions(market=MarketOptions(traces=[str(trace)]), job=JobModel(nodes=nodes, job_hours=48.0),
                      policies=("spotrelay",))
    run: Any = make_run("spotrelay", opts, build_market(opts.market, 0), 0, 0.0)
    run.start()
    run.loop()
    return run.spec.model_dump(mode="json"), list(run.attempts)


def test_on_the_simulated_g4dn_trace_a_16_node_gang_is_told_and_an_8_node_one_is_not() -> None:
    """Where pools hold the gang (8 nodes: about a tenth of its spot time coming up) nothing is said;
    at 16 nodes, a whole-gang restart every ~25 minutes, over a quarter of it is, and the advice says so."""
    spec, attempts = _simulated_attempts(8)
    assert spec["resources"]["min_nodes"] is None and elastic_advice(spec, attempts) is None
    measured = bring_up_share(attempts)
    assert measured is not None and measured[0] < BRING_UP_SHARE
    spec, attempts = _simulated_attempts(16)
    line = elastic_advice(spec, attempts)
    assert line is not None and "spot gangs of 16 nodes" in line
    assert {a.end_reason for a in attempts[:-1]} <= {"interrupted", "node-lost", "migrate", "ready-timeout",
                                                    "heartbeat-timeout"}


def test_simulate_reports_what_describe_would_advise_on_its_spotrelay_runs() -> None:
    """``spotrelay simulate`` says, under its table and in its JSON, on how many of spotrelay's jobs
    describe would advise min_nodes (a stated elastic gang: none; the baselines keep no job record); an
    elastic gang may still hear of recovery.max_slowdown (services/describe.slowdown_line), until it states it."""
    import io
    from pathlib import Path

    from rich.console import Console

    from spotrelay.sim.build import MarketOptions
    from spotrelay.sim.job import JobModel
    from spotrelay.sim.report import print_report
    from spotrelay.sim.runner import SimOptions, simulate

    trace = Path(__file__).resolve().parents[2] / "spotrelay" / "local" / "data" / "bamboo-g4dn-trace.csv"
    opts = SimOptions(market=MarketOptions(traces=[str(trace)]), job=JobModel(nodes=16, job_hours=48.0),
                      policies=("spotrelay", "on-demand"), seeds=2)
    report = simulate(opts)
    advised, runs, line = report.advice("spotrelay")
    assert (advised, runs) == (2, 2) and line is not None and "spot gangs of 16 nodes" in line
    assert report.to_json()["advice"] == {"spotrelay": {"jobs": 2, "of": 2, "advice": line}}
    shown = io.StringIO()
    print_report(report, Console(file=shown, width=200))
    assert f"spotrelay: `spotrelay describe` would advise on 2 of 2 job(s): {line}" in shown.getvalue()
    opts.jobs = 2  # (one seed's jobs are summed into one result: every job counts)
    assert simulate(opts).advice("spotrelay")[:2] == (4, 4)
    opts.spotrelay_switches = {"min_nodes": 8}
    elastic = simulate(opts)
    _, of, said = elastic.advice("spotrelay")
    assert of == 4 and "spot gangs of 16 nodes" not in (said or "")  # it states min_nodes: no such advice
    opts.spotrelay_switches = {"min_nodes": 8, "max_slowdown": 3}  # (nor of the wall-time limit, once stated)
    assert simulate(opts).advice("spotrelay") == (0, 4, None) and simulate(opts).to_json()["advice"] == {}


def _noticed(at_risk: list[bool], reason: str = "interrupted") -> list[Attempt]:
    return [a.model_copy(update={"notice_at_risk": r}) for a, r in zip(gangs(len(at_risk), reason=reason), at_risk,
                                                                          strict=True)]


def test_notices_whose_saves_could_not_land_are_told_with_their_count() -> None:
    line = notice_advice(_noticed([True, False, True, True]))
    assert line is not None and line.startswith("on 3 of the last 4 spot notices the ranks' last save took longer")
    assert "more nodes make it smaller" in line
    assert notice_advice(_noticed([True, False, False, True])) is not None  # half: told
    assert notice_advice(_noticed([True, False, False, False])) is None  # a quarter: not
    assert notice_advice(_noticed([True, True])) is None  # too few notices to say
    assert notice_advice(_noticed([True, True, True], reason="node-lost")) is None  # no notice came
    # only the newest LOOKBACK attempts count: the market the job runs in now
    old = _noticed([True] * 8)
    new = [a.model_copy(update={"number": a.number + 8}) for a in _noticed([False] * LOOKBACK)]
    assert notice_advice([*old, *new]) is None


def test_job_advice_gives_each_line_its_history_supports() -> None:
    both = _noticed([True] * 6)  # fixed gangs restarting every 26 min, their notices at risk
    lines = job_advice(FIXED, both)
    assert len(lines) == 2 and lines[0] == elastic_advice(FIXED, both) and lines[1] == notice_advice(both)
    assert job_advice(FIXED, gangs(6, up_s=10.0)) == []


def test_the_simulator_advises_a_2_node_gang_whose_shards_cannot_flush_inside_the_notice() -> None:
    """The stated job's 1,120 GB on 2 nodes flushes in 135 s against the 120 s notice (docs/simulator.md, (c));
    on 4 nodes in 68 s: no advice."""
    from pathlib import Path

    from spotrelay.sim.build import MarketOptions
    from spotrelay.sim.job import JobModel
    from spotrelay.sim.runner import SimOptions, simulate

    trace = Path(__file__).resolve().parents[2] / "spotrelay" / "local" / "data" / "bamboo-g4dn-trace.csv"
    said: dict[int, tuple[int, int, str | None]] = {}
    for nodes in (2, 4):
        opts = SimOptions(market=MarketOptions(traces=[str(trace)]), job=JobModel(nodes=nodes, job_hours=48.0),
                          policies=("spotrelay",), seeds=2)
        said[nodes] = simulate(opts).advice("spotrelay")
    assert said[2][:2] == (2, 2) and said[2][2] is not None and "spot notices the ranks' last save" in said[2][2]
    assert said[4] == (0, 2, None)
