"""The simulator's native build (spotrelay/sim_native.py) runs what the source runs, and only a build of
the source as it is: every policy's report the same, byte for byte, from the build and from the source
(in this process and across worker processes), and the pinned runs' numbers, decisions and timelines.

The build is what ``make install`` and ``make test`` make; ``make test`` requires it
(``SPOTRELAY_SIM_NATIVE_REQUIRED=1``), a bare ``pytest`` skips what needs it when it is missing or stale.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spotrelay import sim_native

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "spotrelay" / "local" / "data" / "bamboo-g4dn-trace.csv"
CLI = str(Path(sys.executable).with_name("spotrelay"))  # (the console script beside this interpreter)


def _env(native: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), sim_native.ENV: native, "MLFLOW_DISABLE_TELEMETRY": "true"}


def _probe(code: str, native: str) -> list[str]:
    """The lines ``code`` prints in a fresh interpreter with ``SPOTRELAY_SIM_NATIVE=native``."""
    done = subprocess.run([sys.executable, "-c", code], env=_env(native), capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()


def _from_build(path: str) -> bool:
    return path.startswith(str(sim_native.BUILD)) and path.endswith(".so")


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(sim_native.ENV, "1")  # (the tests' own default is the source: tests/conftest.py)
    ok, why = sim_native.status()
    if not ok:
        if os.environ.get("SPOTRELAY_SIM_NATIVE_REQUIRED") == "1":
            pytest.fail(f"the simulator's native build is required here: {why}")
        pytest.skip(why)


def test_the_build_is_used_only_when_asked_and_only_for_the_source_it_was_built_from(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    manifest = tmp_path / "manifest.json"
    monkeypatch.setenv(sim_native.ENV, "1")
    assert sim_native.status(manifest) == (False, "source (no native build: make install builds it)")
    manifest.write_text("{not json")
    assert not sim_native.status(manifest)[0]
    manifest.write_text(json.dumps(["a list"]))
    assert not sim_native.status(manifest)[0]
    manifest.write_text(json.dumps({"digest": hashlib.sha256(b"an older source").hexdigest(), "mypyc": "x"}))
    assert sim_native.status(manifest) == (
        False, "source (the native build is older than the source: make install rebuilds it)")
    fresh = {"digest": sim_native.source_digest(), "mypyc": "2.4.1", "modules": ["spotrelay/sim/engine.py",
                                                                                 "spotrelay/sim/asl.py"]}
    manifest.write_text(json.dumps(fresh))
    incomplete = (False, "source (the native build is incomplete: make install rebuilds it)")
    assert sim_native.status(manifest) == incomplete  # (no module files at all)
    (tmp_path / "spotrelay" / "sim").mkdir(parents=True)
    (tmp_path / "spotrelay" / "sim" / "engine.cpython-311-x86_64-linux-gnu.so").write_bytes(b"")
    assert sim_native.status(manifest) == incomplete  # (asl's is missing)
    (tmp_path / "spotrelay" / "sim" / "asl.cpython-311-x86_64-linux-gnu.so").write_bytes(b"")
    assert sim_native.status(manifest) == (True, "native (mypyc 2.4.1)")
    manifest.write_text(json.dumps({**fresh, "modules": []}))
    assert sim_native.status(manifest) == incomplete
    manifest.write_text(json.dumps(fresh))
    for off in ("0", "false", "No", " off "):
        monkeypatch.setenv(sim_native.ENV, off)
        assert sim_native.status(manifest) == (False, f"source ({sim_native.ENV}={off.strip()})")
    monkeypatch.setenv(sim_native.ENV, "")  # (set but empty: the default, on)
    assert sim_native.status(manifest)[0]


def test_the_digest_covers_every_module_of_the_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # an edit anywhere in the package (not only the simulator: compiled code assumes its imports) moves it
    package = tmp_path / "spotrelay"
    (package / "placement").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "placement" / "policy.py").write_text("A = 1\n")
    monkeypatch.setattr(sim_native.spotrelay, "__file__", str(package / "__init__.py"))
    before = sim_native.source_digest()
    (package / "placement" / "policy.py").write_text("A = 2\n")
    assert sim_native.source_digest() != before
    (package / "placement" / "policy.py").write_text("A = 1\n")
    assert sim_native.source_digest() == before
    (package / "placement" / "new.py").write_text("")
    assert sim_native.source_digest() != before


def test_the_compiled_modules_are_the_simulators_but_its_loader_workers_and_job_model() -> None:
    names = {Path(m).stem for m in sim_native.compiled_modules()}
    assert {"engine", "controller", "asl", "market", "runner"} <= names
    assert not names & {"__init__", "parallel", "job"}
    assert all(m.startswith("spotrelay/sim/") and m.endswith(".py") for m in sim_native.compiled_modules())


@pytest.mark.usefixtures("built")
def test_the_native_modules_are_the_ones_imported_when_on_and_never_when_off() -> None:
    probe = ("import spotrelay.sim.engine as e, spotrelay.sim.parallel as p, spotrelay.sim.job as j\n"
             "from spotrelay.sim_native import activate\n"
             "print(e.__file__); print(p.__file__); print(j.__file__); print(activate([])[1])")
    engine, parallel, job, said = _probe(probe, "1")
    assert _from_build(engine)
    assert parallel == str(ROOT / "spotrelay" / "sim" / "parallel.py")
    assert job == str(ROOT / "spotrelay" / "sim" / "job.py")
    assert said.startswith("native (mypyc ")
    assert _probe(probe, "0")[0] == str(ROOT / "spotrelay" / "sim" / "engine.py")


SWEEPS = {
    # every policy, spares and two regions, 2 seeds x 2 jobs over 2 worker processes (results cross pipes)
    "synthetic": ["--trace-format", "synthetic", "--nodes", "16", "--job-hours", "48", "--jobs", "2", "--seeds", "2",
                  "--regions", "us-east-1,us-west-2", "--switch", "spares=1", "--variant", "lean:spares=0,min_nodes=12",
                  "--workers", "2"],
    # the stormy trace: a whole-gang restart every half hour, moves, reviews, the elastic gang, one process
    "g4dn": ["--trace", str(TRACE), "--nodes", "16", "--job-hours", "72", "--switch", "min_nodes=8",
             "--switch", "every_minutes=auto", "--workers", "1"],
}


@pytest.mark.usefixtures("built")
@pytest.mark.parametrize("sweep", sorted(SWEEPS))
def test_the_native_build_reports_what_the_source_reports_byte_for_byte(sweep: str, tmp_path: Path) -> None:
    docs = []
    for native in ("0", "1"):
        out = tmp_path / f"{native}.json"
        done = subprocess.run([CLI, "simulate", *SWEEPS[sweep], "--json", str(out)], env=_env(native),
                              capture_output=True, text=True, cwd=ROOT)
        assert done.returncode == 0, done.stderr or done.stdout
        said = "simulator: native (mypyc " if native == "1" else f"simulator: source ({sim_native.ENV}=0)"
        assert said in done.stdout
        docs.append(out.read_bytes())
    assert json.loads(docs[0])["policies"]["spotrelay"]["cost_usd"] > 0
    assert docs[0] == docs[1]


@pytest.mark.usefixtures("built")
def test_the_pinned_runs_hold_on_the_native_build() -> None:
    # the pinned cases (their event counts, numbers, decisions and timelines), run by the compiled modules
    from tests.unit.test_sim_pinned import PINNED

    probe = ("import json, spotrelay.sim.engine as e\n"
             "from tests.unit.test_sim_pinned import CASES, digest\n"
             "print(e.__file__); print(json.dumps({name: digest(opts) for name, opts in CASES.items()}))")
    engine, digests = _probe(probe, "1")[-2:]
    assert _from_build(engine)
    assert json.loads(digests) == PINNED
