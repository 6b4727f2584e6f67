"""Stage the Lambda code and layer into ``layers/build/`` so that no asset is a folder with .venv in it.

- ``layers/build/handlers/``: only the first-party modules the handlers can import
  (:func:`cdk.imports.closure`): no twin, no CLI, no simulator, no tests; one asset shared by every handler.
- ``layers/build/layer/python/``: the third-party packages listed in ``layers/requirements.txt`` and
  their dependencies, copied from the installed distributions (offline: no pip download). Packages the
  Lambda Python runtime already ships (boto3 and its dependencies) are left out; torch and deepspeed
  are refused outright.

Compiled wheels (pydantic-core, PyYAML) are built for the interpreter that runs the synth, so the
Lambda runtime is pinned to that interpreter's minor version (:func:`lambda_python_version`).
"""

from __future__ import annotations

import ast
import compileall
import contextlib
import os
import py_compile
import re
import shutil
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

from cdk import imports

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "layers" / "build"
REQUIREMENTS = ROOT / "layers" / "requirements.txt"
SUPPORTED_PYTHON = ("3.11", "3.12")
# In the Lambda Python runtime already (and pinned there to versions botocore works with).
RUNTIME_PROVIDED = {"boto3", "botocore", "s3transfer", "jmespath", "urllib3", "python-dateutil", "six"}
FORBIDDEN = {"torch", "deepspeed", "nvidia-nccl-cu12", "triton"}


def lambda_python_version() -> str:
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    if version not in SUPPORTED_PYTHON:
        raise RuntimeError(
            f"synthesize with Python {' or '.join(SUPPORTED_PYTHON)} (the layer's compiled "
            f"wheels must match the Lambda runtime); this is {version}"
        )
    return version


def discover_handlers(functions_dir: Path = ROOT / "functions") -> list[str]:
    """Modules ``functions/<name>.py`` that define a top-level ``handler`` (names with ``_`` skipped)."""
    found = []
    for path in sorted(functions_dir.glob("*.py")):
        if path.name.startswith("_"):
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        names = {node.name for node in tree.body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)} | {
            target.id
            for node in tree.body
            if isinstance(node, ast.Assign)
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        if "handler" in names:
            found.append(path.stem)
    return found


def _compile(folder: Path, shown_as: str) -> None:
    """Byte-compile every module in place: Lambda cannot write __pycache__ under /var/task or /opt, so
    without these each cold start compiles every module it imports (seconds). Hash-based pycs stay valid
    whatever mtimes the asset zip gives the files; the interpreter is the runtime's minor version."""
    ok = compileall.compile_dir(str(folder), quiet=2, workers=1, ddir=shown_as,  # tracebacks name Lambda's paths
                                invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    if not ok:
        raise RuntimeError(f"byte-compiling {folder} failed")


def _publish(tmp: Path, out: Path) -> Path:
    """Swap a freshly built folder into place, so two synths at once never see a half-built one."""
    old = out.with_name(f".{out.name}.old.{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        os.rename(out, old)
    try:
        os.rename(tmp, out)
    except OSError:  # another synth published the same content first
        shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(old, ignore_errors=True)
    return out


def _fresh(out: Path) -> Path:
    tmp = out.with_name(f".{out.name}.tmp.{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def bundle_files(handlers: list[str] | None = None, root: Path = ROOT) -> list[Path]:
    """Source files of the production bundle, relative to ``root``: the handlers' import closure."""
    modules = imports.closure(imports.handler_modules(handlers or discover_handlers(root / "functions")), root)
    paths = (imports.module_path(m, root) for m in modules)
    return sorted(p.relative_to(root) for p in paths if p is not None)


def stage_handlers(root: Path = ROOT, out: Path = BUILD / "handlers", handlers: list[str] | None = None) -> Path:
    """Copy the production bundle's source (:func:`bundle_files`) to a clean folder."""
    tmp = _fresh(out)
    for rel in bundle_files(handlers, root):
        target = tmp / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / rel, target)
    _compile(tmp, "/var/task")
    return _publish(tmp, out)


def _name(dist_name: str) -> str:
    return re.sub(r"[-_.]+", "-", dist_name).lower()


def _requirements() -> list[str]:
    lines = REQUIREMENTS.read_text().splitlines()
    return [line.split("#")[0].strip() for line in lines if line.split("#")[0].strip()]


def layer_distributions(roots: list[str] | None = None) -> list[metadata.Distribution]:
    """The installed distributions the layer needs: the roots and their (marker-true) dependencies."""
    todo = [Requirement(r) for r in (roots if roots is not None else _requirements())]
    seen: dict[str, metadata.Distribution] = {}
    while todo:
        req = todo.pop()
        name = _name(req.name)
        if name in seen or name in RUNTIME_PROVIDED:
            continue
        if name in FORBIDDEN:
            raise RuntimeError(f"{name} must never enter the Lambda layer")
        dist = metadata.distribution(req.name)
        seen[name] = dist
        envs = [{"extra": extra} for extra in req.extras] or [{"extra": ""}]
        for dep in dist.requires or []:
            dep_req = Requirement(dep)
            if dep_req.marker is None or any(dep_req.marker.evaluate(env) for env in envs):
                todo.append(dep_req)
    return sorted(seen.values(), key=lambda d: _name(d.metadata["Name"]))


def stage_layer(out: Path = BUILD / "layer") -> Path:
    """Copy the files of every layer distribution into ``out/python`` (the layout Lambda expects)."""
    tmp = _fresh(out)
    site = tmp / "python"
    for dist in layer_distributions():
        for file in dist.files or []:
            parts = Path(str(file)).parts
            if parts[0] == ".." or "__pycache__" in parts or str(file).endswith((".pyc", ".pth")):
                continue  # scripts outside site-packages, caches, editable-install hooks
            src = Path(str(dist.locate_file(file)))
            if src.is_file():
                target = site / file
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, target)
    _compile(tmp, "/opt")
    return _publish(tmp, out)
