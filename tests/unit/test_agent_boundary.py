"""The agent talks to the controller only through its port (spotrelay/contracts/agent.py): it does
not import the job store, the domain models, the controller's settings or services, so it cannot
write a node or job record, nor depend on how the controller keeps them. Checked on the source
(every import statement under agent/, lazy ones included) and on what importing the agent loads."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from spotrelay.contracts import agent as port
from spotrelay.domain.models import NodeState, node_id_for
from spotrelay.domain.status import JobStatus

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = (
    "spotrelay.domain",
    "spotrelay.settings",
    "spotrelay.ports.job_store",
    "spotrelay.adapters.dynamodb_job_store",
    "spotrelay.adapters.memory_job_store",
    "spotrelay.services",
    "spotrelay.recovery",
    "spotrelay.placement",
    "spotrelay.local",
    "spotrelay.sim",
    "functions",
)


def _imports(path: Path) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def _forbidden(module: str) -> bool:
    return any(module == f or module.startswith(f + ".") for f in FORBIDDEN)


def test_agent_sources_import_nothing_of_the_controllers_records() -> None:
    files = sorted((ROOT / "agent").rglob("*.py"))
    assert len(files) > 20
    bad = [f"{f.relative_to(ROOT)}:{line} imports {mod}" for f in files for line, mod in _imports(f) if _forbidden(mod)]
    assert bad == []


def test_the_check_sees_a_lazy_import(tmp_path: Path) -> None:
    sneaky = tmp_path / "sneaky.py"
    sneaky.write_text("def f():\n    from spotrelay.domain.models import Node\n    import spotrelay.settings\n")
    assert [m for _, m in _imports(sneaky) if _forbidden(m)] == [
        "spotrelay.domain.models", "spotrelay.domain.models.Node", "spotrelay.settings"]


def test_importing_the_agent_loads_none_of_them() -> None:
    code = ("import sys, agent.main, agent.daemon, agent.training, agent.tracking, agent.spare, agent.code\n"
            "print('\\n'.join(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    loaded = [m for m in out.stdout.split() if _forbidden(m)]
    assert loaded == []


def test_the_ports_names_match_the_controllers() -> None:
    """The port spells node states and terminal statuses as text; they must stay the controller's."""
    assert {port.PENDING, port.READY, port.RUNNING, port.DOOMED, port.EXITED} <= {s.value for s in NodeState}
    assert {s.value for s in JobStatus if s.terminal} == port.TERMINAL
    assert node_id_for(3, 1) == "a3-r1"  # the domain re-exports the port's spelling
