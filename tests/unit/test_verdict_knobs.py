"""bench/verdict_knobs.py: variants of the spot verdict's constants, each run in its own fork."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.sim_sweep import MARKETS
from bench.verdict_knobs import VERDICT_KNOBS, _one, parse_variant
from spotrelay.placement import catalog, spot_evidence

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "bench" / "verdict_knobs.py"), *args], capture_output=True,
                          text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "MLFLOW_DISABLE_TELEMETRY": "true"},
                          timeout=300)


def test_variants_parse_and_name_what_is_wrong() -> None:
    assert parse_variant("default") == {}
    assert parse_variant("LOST_SHARE=1.0, HOLD_HOURS=12") == {"LOST_SHARE": 1.0, "HOLD_HOURS": 12.0}
    for bad, named in (("EVIDENCE_ATTEMPTS=96", "EVIDENCE_ATTEMPTS"), ("LOST_SHARE", "LOST_SHARE"),
                       ("HOLD_HOURS=soon", "soon")):
        with pytest.raises(ValueError, match=named):
            parse_variant(bad)
    for name in VERDICT_KNOBS:  # each verdict knob is a module constant the verdict reads when asked
        assert isinstance(getattr(spot_evidence, name), int | float)


def test_a_trace_that_does_not_read_is_one_line_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "bad.csv").write_text("ms,what,node\n10,add,a\nxx,remove,a\n")
    bad = _run("--trace-dir", str(tmp_path), "--markets", "bad", "--nodes", "4", "--seeds", "1", "--workers", "1")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "bad.csv" in bad.stderr


def test_a_variant_changes_the_run_and_the_sweep_prints_it_against_the_first() -> None:
    # the node reading at 16 nodes, seed 5: the old verdict (lost at parity, a 12 h hold, no span) parks the
    # job on on-demand longer (docs/simulator-tuning.md, "Spot verdict: a margin before lost"; at 8 nodes it
    # did until survivors stopped idling through backoffs and a reclaim wave became one recovery)
    values = (spot_evidence.LOST_SHARE, spot_evidence.HOLD_HOURS, spot_evidence.MIN_SPOT_SPAN_HOURS)
    shipped = _one(({}, MARKETS["g4dn-nodes"], 16, 5, 72.0, {}))["spotrelay"]
    knobs = {"LOST_SHARE": 1.0, "HOLD_HOURS": 12.0, "MIN_SPOT_SPAN_HOURS": 0.0}
    old = _one((knobs, MARKETS["g4dn-nodes"], 16, 5, 72.0, {}))["spotrelay"]
    assert old["on_demand_share"] > shipped["on_demand_share"]
    assert old["cost_per_useful_gpu_hour"] > shipped["cost_per_useful_gpu_hour"]
    assert values == (spot_evidence.LOST_SHARE, spot_evidence.HOLD_HOURS, spot_evidence.MIN_SPOT_SPAN_HOURS)
    out = _run("--variants", "default;LOST_SHARE=100", "--markets", "g4dn", "--nodes", "4", "--seeds", "1",
               "--job-hours", "6", "--workers", "1")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[1] == "g4dn 4 nodes, 1 seed(s)" and lines[2].split()[:2] == ["default", "1.000"]
    assert lines[3].split()[0] == "LOST_SHARE=100"
    bad = _run("--variants", "default;BOGUS=1")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "BOGUS" in bad.stderr
    bad = _run("--nodes", "8,x")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "'x'" in bad.stderr
    bad = _run("--switch", "sparez=1")  # switches are simulate's (runner.parse_switch), named when wrong
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "sparez" in bad.stderr


def test_a_restore_minutes_variant_reaches_placement_and_is_undone() -> None:
    """P5_RESTORE_MINUTES / P4D_RESTORE_MINUTES set the catalog's loss per interruption for the run: a
    10 h one ranks the spot pools otherwise (spot first stays: on-demand is the verdict's, not the score's),
    so the run costs otherwise; the catalog is the shipped one after."""
    shipped = dict(catalog.INSTANCES)
    base = _one(({}, MARKETS["g4dn"], 8, 0, 12.0, {}))["spotrelay"]
    dear = _one(({"P5_RESTORE_MINUTES": 600.0, "P4D_RESTORE_MINUTES": 600.0}, MARKETS["g4dn"], 8, 0, 12.0, {}))
    assert dear["spotrelay"]["cost_per_useful_gpu_hour"] != base["cost_per_useful_gpu_hour"]
    assert shipped == catalog.INSTANCES
    assert parse_variant("P5_RESTORE_MINUTES=9") == {"P5_RESTORE_MINUTES": 9.0}
