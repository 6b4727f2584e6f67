"""The simulated Recover task ranks a shortlist of quotes (sim/shortlist.py ``recovery_quotes``), not
every pool's: with ``VERIFY_SHORTLIST`` every recovery also runs the strategy over every quote and must
take the same decision (kept instances, action, pool), and the pinned results must not move."""

from __future__ import annotations

import pytest

from spotrelay.sim import moves
from tests.unit.test_sim_pinned import CASES, PINNED, digest


def test_recovery_shortlist_decides_as_every_quote(monkeypatch: pytest.MonkeyPatch) -> None:
    # synthetic-32: a 32-node gang on spot, recovered ~100 times (the speed benchmark's path)
    monkeypatch.setattr(moves, "VERIFY_SHORTLIST", True)
    assert digest(CASES["synthetic-32"]) == PINNED["synthetic-32"]
