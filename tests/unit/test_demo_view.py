"""The demo's live view on a narrow terminal: every cell folds onto more lines, none ends in "…"."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from rich.console import Console

from spotrelay.domain.models import Pool
from spotrelay.local.compute import LocalInstance
from spotrelay.local.demo_view import EventLog, render
from spotrelay.ports.compute import Instance


@pytest.mark.parametrize("width", [50, 80, 120])
def test_the_live_view_folds_cells_instead_of_cutting_them(tmp_path: Path, width: int) -> None:
    pool = Pool(region="us-east-1", az="us-east-1a", instance_type="p5.48xlarge", market="spot")
    instances = [LocalInstance(instance=Instance(instance_id=f"i-0123456789abcdef{r}", pool=pool, rank=r, attempt=2),
                               work_dir=tmp_path, imds=None, launched_at=float(r),  # type: ignore[arg-type]
                               booted_at=1.0) for r in range(2)]
    log = EventLog(t0=time.time())
    log.add("attempt 2: node-lost on rank 1 (i-0123456789abcdef1); resuming from the last committed checkpoint")
    console = Console(width=width, record=True, color_system=None)
    console.print(render(None, [], instances, {}, log, 12.0, "a note"))
    text = console.export_text()
    assert "…" not in text
    assert all(len(line) <= width for line in text.splitlines())
    assert text.count("a2-r") == 2 and "committed" in text  # every row and the whole event are there
    if width >= 120:  # room enough: nothing folds
        assert "i-0123456789abcdef0" in text and "us-east-1a p5.48xlarge spot" in text
