"""The state diagram in docs/ is the transition table, edge for edge."""

from __future__ import annotations

import re

from spotrelay.domain.status import TRANSITIONS, JobStatus
from tests.conftest import ROOT


def test_diagram_matches_table() -> None:
    text = (ROOT / "docs" / "job-lifecycle.md").read_text()
    edges = set(re.findall(r"^\s+([A-Z]+) --> ([A-Z]+)$", text, re.M))
    table = {(a.value, b.value) for a, targets in TRANSITIONS.items() for b in targets}
    assert edges == table
    for status in JobStatus:
        assert f"| {status.value} |" in text, f"{status} is not described"
