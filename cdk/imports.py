"""The first-party modules the Lambda handlers can import: the production bundle and nothing else.

Read from the source (``ast``), never by importing it: every ``import`` statement counts, whether at
module level, inside a function (lazy imports) or under ``TYPE_CHECKING``, so the closure is an
over-approximation of what a handler may load. A package's ``__init__`` is part of the closure of
any of its modules (Python runs it first).
"""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIRST_PARTY = ("functions", "spotrelay")


def module_path(module: str, root: Path = ROOT) -> Path | None:
    """The source file of a first-party module (``a/b.py`` or ``a/b/__init__.py``), None otherwise."""
    if module.split(".")[0] not in FIRST_PARTY:
        return None
    base = root.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _is_package(module: str, root: Path) -> bool:
    path = module_path(module, root)
    return path is not None and path.name == "__init__.py"


@lru_cache(maxsize=512)
def _parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def direct_imports(module: str, root: Path = ROOT) -> set[str]:
    """First-party modules ``module``'s source names in any import statement."""
    path = module_path(module, root)
    if path is None:
        return set()
    package = module if _is_package(module, root) else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(_parsed(path)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                anchor = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{anchor}.{base}" if base else anchor
            found.add(base)
            # ``from pkg import name``: name may be a submodule
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {m for m in found if module_path(m, root) is not None}


def _with_parents(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def closure(roots: list[str], root: Path = ROOT) -> set[str]:
    """Every first-party module reachable from ``roots`` by imports, with their parent packages."""
    seen: set[str] = set()
    todo = [m for r in roots for m in _with_parents(r)]
    while todo:
        module = todo.pop()
        if module in seen or module_path(module, root) is None:
            continue
        seen.add(module)
        for imported in direct_imports(module, root):
            todo.extend(_with_parents(imported))
    return seen


def handler_modules(handlers: list[str]) -> list[str]:
    return [f"functions.{h}" for h in handlers]
