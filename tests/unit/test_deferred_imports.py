"""Deferred optional imports in the ranks (agent/deferred_imports.py): `import pkg` costs nothing until
something uses the package, and then it is the real package, submodules included."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent.deferred_imports import ENV_DEFER

ROOT = Path(__file__).resolve().parents[2]

# A package whose import leaves a trace (the marker file) and has a submodule.
PKG_INIT = """
import os
open(os.environ["MARKER"], "a").write("init\\n")
VALUE = 42
state = {"n": 0}
"""
PKG_SUB = """
import heavypkg
open(__import__("os").environ["MARKER"], "a").write("sub\\n")
FROM_PARENT = heavypkg.VALUE
"""


def _run(tmp_path: Path, body: str) -> dict[str, object]:
    pkg = tmp_path / "lib" / "heavypkg"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text(PKG_INIT)
    (pkg / "sub.py").write_text(PKG_SUB)
    marker = tmp_path / "marker.txt"
    marker.unlink(missing_ok=True)
    script = tmp_path / "probe.py"
    script.write_text(
        "import json, os, sys\n"
        "from agent.deferred_imports import defer\n"
        "out = {'deferred': defer(('heavypkg', 'not_installed_pkg'))}\n"
        "def trace(): m = os.environ['MARKER']; return open(m).read().split() if os.path.exists(m) else []\n"
        + body
        + "\nprint(json.dumps(out))\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path / 'lib'}", "MARKER": str(marker)}
    result = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_import_runs_nothing_until_the_package_is_used(tmp_path: Path) -> None:
    out = _run(
        tmp_path,
        "import heavypkg, inspect\n"
        "out['after_import'] = trace()\n"
        "inspect.getmodule(trace)  # reads __file__ of every module in sys.modules\n"
        "out['after_scan'] = trace()\n"
        "out['value'] = heavypkg.VALUE\n"
        "out['after_use'] = trace()\n"
        "heavypkg.state['n'] += 1; import heavypkg as again\n"
        "out['shared'] = sys.modules['heavypkg'].state['n']\n"
        "try:\n    import not_installed_pkg\nexcept ImportError:\n    out['missing'] = 'ImportError'\n",
    )
    assert out["deferred"] == ["heavypkg"]  # a package that is not installed is left alone
    assert out["after_import"] == [] and out["after_scan"] == []
    assert out["value"] == 42 and out["after_use"] == ["init"]
    assert out["shared"] == 1  # the stand-in and the real module are one state
    assert out["missing"] == "ImportError"


def test_submodule_import_runs_the_package_first(tmp_path: Path) -> None:
    out = _run(
        tmp_path,
        "import heavypkg.sub\n"
        "out['trace'] = trace()\n"
        "out['from_parent'] = heavypkg.sub.FROM_PARENT\n"
        "out['same'] = sys.modules['heavypkg'].sub is sys.modules['heavypkg.sub']\n"
        "from heavypkg import VALUE\n"
        "out['value'] = VALUE\n",
    )
    assert out["trace"] == ["init", "sub"]  # as a plain import: the package's __init__ before its submodule
    assert out["from_parent"] == 42 and out["same"] is True and out["value"] == 42


@pytest.mark.parametrize(("setting", "deferred"), [(None, True), ("0", False)])
def test_rank_wrapper_defers_mlflow_and_the_script_can_still_use_it(
    tmp_path: Path, setting: str | None, deferred: bool
) -> None:
    script = tmp_path / "script.py"
    script.write_text(
        "import json, sys\n"
        "import mlflow  # what `import deepspeed` does\n"
        "untouched = 'mlflow.tracking' not in sys.modules\n"
        "print(json.dumps([untouched, bool(mlflow.__version__), 'mlflow.tracking' in sys.modules]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(ENV_DEFER, None)
    if setting is not None:
        env[ENV_DEFER] = setting  # the job's opt-out
    out = subprocess.run(
        [sys.executable, "-m", "agent.launcher", str(script)], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert json.loads(out.strip().splitlines()[-1]) == [deferred, True, True]
