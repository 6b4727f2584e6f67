"""The synthesized Lambda assets hold production code only, and stay small (DESIGN.md section 9)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from cdk import imports, staging
from tests.infrastructure.conftest import Synth

# What a production bundle must never hold: the twin, the CLI, the simulator, tests, the agent.
FORBIDDEN_PREFIXES = ("spotrelay/local/", "spotrelay/cli/", "spotrelay/sim/", "tests/", "agent/", "cdk/")
# Source text that would let the environment pick code to import, or that belongs to the twin/tests.
FORBIDDEN_TEXT = (
    re.compile(r"importlib\.import_module\("),
    re.compile(r"SPOTRELAY_\w+_FACTORY"),
    re.compile(r"^\s*(from|import) (moto|pytest|spotrelay\.local|spotrelay\.cli|spotrelay\.sim)\b", re.M),
)
MAX_HANDLERS_BYTES = 2 << 20  # ~1.2 MB today (source + bytecode)
MAX_LAYER_BYTES = 40 << 20  # ~24 MB today; Lambda allows 250 MB unzipped for code + layers


def _asset_dir(synth: Synth, code: dict[str, Any]) -> Path:
    digest = str(code["S3Key"]).removesuffix(".zip")
    path = synth.outdir / f"asset.{digest}"
    assert path.is_dir(), f"no asset folder for {code['S3Key']} in {synth.outdir}"
    return path


def _files(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*")) if p.is_file()}


def _source_of(pyc: str) -> str:
    """``a/__pycache__/b.cpython-311.pyc`` -> ``a/b.py``"""
    path = Path(pyc)
    return str(path.parent.parent / (path.name.split(".")[0] + ".py"))


def _handler_assets(synth: Synth) -> dict[str, Path]:
    functions = synth.resources(synth.home, "AWS::Lambda::Function")
    return {
        fn["Properties"]["Handler"]: _asset_dir(synth, fn["Properties"]["Code"])
        for fn in functions.values()
        if "S3Key" in fn["Properties"]["Code"]
    }


def test_handler_assets_hold_only_the_handlers_import_closure(synth: Synth) -> None:
    assets = _handler_assets(synth)
    assert {h.removesuffix(".handler") for h in assets} == {f"functions.{m}" for m in staging.discover_handlers()}
    expected = {str(p) for p in staging.bundle_files()}
    for handler, asset in assets.items():
        files = _files(asset)
        bad = [f for f in files if f.startswith(FORBIDDEN_PREFIXES) or not f.endswith((".py", ".pyc"))]
        assert not bad, f"{handler}'s asset holds non-production files: {bad}"
        size = sum(files.values())
        compiled = {f for f in files if f.endswith(".pyc")}
        # every module ships byte-compiled (Lambda cannot write __pycache__; cold starts would compile)
        assert {_source_of(f) for f in compiled} == expected, f"{handler}'s asset lacks some .pyc"
        files = {f: n for f, n in files.items() if f not in compiled}
        assert set(files) == expected, (
            f"{handler}'s asset differs from the handlers' import closure: "
            f"extra {sorted(set(files) - expected)}, missing {sorted(expected - set(files))}"
        )
        for name in files:  # sources only; the .pyc are compiled from them
            text = (asset / name).read_text()
            for pattern in FORBIDDEN_TEXT:
                assert not pattern.search(text), f"{name} in {handler}'s asset matches {pattern.pattern!r}"
        assert size <= MAX_HANDLERS_BYTES, f"{handler}'s asset is {size} bytes (limit {MAX_HANDLERS_BYTES})"


def test_no_production_module_can_reach_the_twin_or_the_cli() -> None:
    reach = imports.closure(imports.handler_modules(staging.discover_handlers()))
    assert not [m for m in reach if m.startswith(("spotrelay.local", "spotrelay.cli", "spotrelay.sim"))]
    # the closure is real: the services the handlers call are in it
    assert {"spotrelay.services.workflow_tasks", "spotrelay.adapters.ec2_compute"} <= reach


def test_cdk_never_imports_the_twin() -> None:
    root = Path(__file__).resolve().parents[2] / "cdk"
    for path in root.glob("*.py"):
        text = path.read_text()
        assert not re.search(r"spotrelay\.(local|cli|sim)\b", text), f"{path.name} refers to the twin or the CLI"


def test_layer_asset_holds_third_party_packages_only_and_no_torch(synth: Synth) -> None:
    layers = synth.resources(synth.home, "AWS::Lambda::LayerVersion")
    assert len(layers) == 1
    (layer,) = layers.values()
    asset = _asset_dir(synth, layer["Properties"]["Content"])
    files = _files(asset)
    tops = {Path(f).parts[1] for f in files if f.startswith("python/") and len(Path(f).parts) > 2}
    assert "pydantic" in tops and "aws_lambda_powertools" in tops
    assert not tops & {"torch", "deepspeed", "spotrelay", "functions", "moto", "boto3", "botocore", "cdk"}, tops
    size = sum(files.values())
    assert size <= MAX_LAYER_BYTES, f"the layer is {size} bytes (limit {MAX_LAYER_BYTES})"


def test_imports_closure_follows_relative_lazy_and_package_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "spotrelay"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from . import leaf\n")
    (pkg / "sub" / "leaf.py").write_text("def f():\n    from spotrelay import lazy\n")
    (pkg / "lazy.py").write_text("")
    (pkg / "unused.py").write_text("")
    fn = tmp_path / "functions"
    fn.mkdir()
    (fn / "__init__.py").write_text("")
    (fn / "h.py").write_text("from spotrelay.sub import leaf\n")
    imports._parsed.cache_clear()
    try:
        found = imports.closure(["functions.h"], tmp_path)
    finally:
        imports._parsed.cache_clear()
    assert found == {"functions", "functions.h", "spotrelay", "spotrelay.sub", "spotrelay.sub.leaf", "spotrelay.lazy"}
