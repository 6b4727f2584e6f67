"""The simulator's native build: the same modules compiled to C by mypyc, used when it matches the source.

Sweeps are what the simulator is for (docs/simulator.md, "Speed"), and its runs are millions of small
events through typed Python; mypyc compiles that same source (no second copy of any decision) into
extension modules that run it about a fifth faster. ``make install``, ``make demo`` and ``make test`` build them
under ``build/sim-native/`` (``python -m spotrelay.sim_native build``), outside the package, so nothing
else (the Lambda bundles) ever sees them; ``spotrelay/sim/__init__.py`` puts that folder first on the
package's path only when:

- ``SPOTRELAY_SIM_NATIVE`` is not ``0`` (or ``false``, ``no``, ``off``; the tests set it to ``0``: several
  patch the simulator's methods, which a compiled class ignores; tests/unit/test_sim_native.py runs the
  build side by side);
- the build's manifest names this interpreter's ABI and the digest of every ``spotrelay/**/*.py`` as it
  is now: compiled code never runs for a source edited since (the edit runs, interpreted, until the
  next build). Any module can change what the compiled code assumes of it, so all are hashed (~10 ms).

Interpreted always: the package's ``__init__``, ``parallel`` (it starts the workers) and
``job`` (its frozen ``JobModel`` crosses the workers' pipes, and mypyc's frozen dataclasses cannot be
unpickled). What mypyc asks of the source is small and written where it applies: no ``**kw`` passed
on to a compiled ``__init__`` (mypyc passes it positionally), no builtin named as a dataclass field's
type, no ``__dict__`` on a compiled instance (``Run.dispose``), no subclass of a builtin exception but
``Exception``, and a float that starts as ``0.0``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import spotrelay

ENV = "SPOTRELAY_SIM_NATIVE"
ROOT = Path(spotrelay.__file__).resolve().parents[1]
BUILD = ROOT / "build" / "sim-native"
MANIFEST = BUILD / "manifest.json"
LOG = BUILD.with_name("sim-native.log")
INTERPRETED = frozenset({"__init__", "parallel", "job", "switches"})
OFF = frozenset({"0", "false", "no", "off"})  # SPOTRELAY_SIM_NATIVE values that mean the source

_status: tuple[bool, str] | None = None


def compiled_modules() -> list[str]:
    """The simulator's modules mypyc compiles, as paths from the repository's root."""
    here = Path(__file__).resolve().parent / "sim"
    return sorted(f"spotrelay/sim/{p.name}" for p in here.glob("*.py") if p.stem not in INTERPRETED)


def source_digest() -> str:
    """sha256 of every ``spotrelay/**/*.py`` (path and bytes, in path order) and this interpreter's ABI."""
    package = Path(spotrelay.__file__).resolve().parent
    h = hashlib.sha256(sys.implementation.cache_tag.encode())
    for path in sorted(package.rglob("*.py")):
        h.update(b"\0" + path.relative_to(package).as_posix().encode() + b"\0")
        h.update(path.read_bytes())
    return h.hexdigest()


def status(manifest: Path = MANIFEST) -> tuple[bool, str]:
    """(whether the native build is used, why in words): off by the environment, not built, stale, or used."""
    setting = os.environ.get(ENV, "").strip()
    if setting.lower() in OFF:
        return False, f"source ({ENV}={setting})"
    try:
        built = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return False, "source (no native build: make install builds it)"
    if not isinstance(built, dict) or built.get("digest") != source_digest():
        return False, "source (the native build is older than the source: make install rebuilds it)"
    try:  # (a module missing from the build would run from source beside compiled ones that cannot take it)
        files = {name.split(".", 1)[0] for name in os.listdir(manifest.parent / "spotrelay" / "sim")
                 if name.endswith(".so")}
    except OSError:
        files = set()
    if not built.get("modules") or any(Path(str(m)).stem not in files for m in built["modules"]):
        return False, "source (the native build is incomplete: make install rebuilds it)"
    return True, f"native (mypyc {built.get('mypyc', '?')})"


def activate(package_path: list[str]) -> tuple[bool, str]:
    """Put the build's modules ahead of the source's on ``package_path`` (``spotrelay.sim.__path__``)
    when ``status`` says so (asked once per process). Returns ``status``'s answer."""
    global _status
    if _status is None:
        _status = status()
        if _status[0]:
            sys.path.append(str(BUILD))  # (mypyc's shared library is a top-level module)
    here = str(BUILD / "spotrelay" / "sim")
    if _status[0] and here not in package_path:
        package_path.insert(0, here)
    return _status


@contextmanager
def _output_to(log: Path) -> Iterator[None]:
    """This process's stdout and stderr (the compiler's too: it inherits them) written to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with log.open("wb") as out:
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, old in zip((1, 2), saved, strict=True):
                os.dup2(old, fd)
                os.close(old)


def in_use() -> str:
    """What this process's simulator runs, in words (``status``'s, as ``activate`` found it)."""
    return (_status or status())[1]


def build() -> str:
    """Compile ``compiled_modules()`` into ``BUILD`` (replacing it once every module built); its manifest."""
    from mypy.version import __version__ as mypy_version
    from mypyc.build import mypycify
    from setuptools import Distribution

    digest = source_digest()  # (before compiling: a source edited meanwhile leaves the build stale, unused)
    fresh, work = BUILD.with_name("sim-native.new"), BUILD.with_name("sim-native.work")
    for d in (fresh, work):
        shutil.rmtree(d, ignore_errors=True)
    cwd = Path.cwd()
    os.chdir(ROOT)  # (mypyc names modules by their paths, and reads pyproject.toml's mypy settings here)
    try:
        with _output_to(LOG):  # (mypyc's notes and the compiler's lines: read only when it fails)
            extensions = mypycify(compiled_modules(), opt_level="3", multi_file=True, target_dir=str(work))
            dist = Distribution({"name": "spotrelay-sim-native", "ext_modules": extensions})
            cmd = dist.get_command_obj("build_ext")
            cmd.build_lib, cmd.build_temp, cmd.parallel = str(fresh), str(work / "obj"), os.cpu_count() or 1
            dist.run_command("build_ext")
    finally:
        os.chdir(cwd)
    manifest = {"digest": digest, "mypyc": mypy_version, "modules": compiled_modules()}
    (fresh / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    shutil.rmtree(BUILD, ignore_errors=True)
    fresh.rename(BUILD)
    shutil.rmtree(work, ignore_errors=True)
    return f"built {len(manifest['modules'])} modules into {BUILD.relative_to(ROOT)} (mypyc {mypy_version})"


def _first_error(log: Path) -> str:
    """The first line of the build's output that names an error ("" when none does)."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return next((line.strip() for line in lines if "error" in line.lower()), "")


def main(argv: list[str]) -> int:
    if argv == ["build"]:
        try:
            print(build())
        except (Exception, SystemExit) as exc:  # (setuptools ends a failed compile with SystemExit)
            why = _first_error(LOG) or (str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            print(f"error: the simulator's native build failed: {why} (its output: {LOG.relative_to(ROOT)})",
                  file=sys.stderr)
            return 1
        return 0
    if argv == ["status"]:
        print(status()[1])
        return 0
    print("usage: python -m spotrelay.sim_native build|status", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
