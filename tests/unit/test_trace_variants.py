"""bench/trace_variants.py: the traces it writes read back, are the same every run, and are what they say."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from spotrelay.sim.inputs import read_bamboo

ROOT = Path(__file__).resolve().parents[2]
G4DN = ROOT / "spotrelay" / "local" / "data" / "bamboo-g4dn-trace.csv"


def _write(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "bench" / "trace_variants.py"), "--out", str(out), *args],
                          capture_output=True, text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT)}, timeout=120)


def test_variants_read_back_the_same_every_run_and_scale_the_storm(tmp_path: Path) -> None:
    assert _write(tmp_path / "a").returncode == 0
    assert _write(tmp_path / "b").returncode == 0
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert names == sorted(["g4dn-x0.33.csv", "g4dn-x0.5.csv", "g4dn-x0.75.csv", "g4dn-x2.csv", "osc.csv",
                            "drops.csv", "small.csv", "mid.csv"])
    for name in names:  # deterministic: fixed seeds
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    base = read_bamboo(G4DN)
    # every lifetime halved: about twice the reclaims (each tiled copy also ends its survivors, as the wrap does)
    half = read_bamboo(tmp_path / "a" / "g4dn-x0.5.csv")
    assert 1.7 < half.removals_per_node_hour() / base.removals_per_node_hour() < 2.3
    assert abs(half.mean_capacity() - base.mean_capacity()) < 0.5 and half.period_s >= 24 * 3600
    small = read_bamboo(tmp_path / "a" / "small.csv")
    assert 6 <= small.mean_capacity() <= 14


def test_a_bad_base_trace_is_one_line_naming_it(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("10,add,a\n20,vanish,a\n")
    result = _write(tmp_path / "out", "--trace", str(bad))
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: {bad}:2: action 'vanish' is not 'add' or 'remove'"
    assert not (tmp_path / "out").exists()
