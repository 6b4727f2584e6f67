"""The campaign files each trainer event under the attempt the trainer ran in (docs/chaos.md,
``checkpoints_lost``), not under the attempt its node was launched for."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from spotrelay.contracts.control import TrainerEvent, append_event
from spotrelay.local.campaign import _node_events


def _node(tmp: Path, name: str, job: str, attempt: int, events: list[TrainerEvent]) -> Any:
    work = tmp / name
    for e in events:
        append_event(work / "control", e)
    return SimpleNamespace(instance=SimpleNamespace(job_id=job, attempt=attempt), work_dir=work)


def test_a_node_serving_a_later_attempt_files_its_events_there(tmp_path: Path) -> None:
    survivor = _node(tmp_path, "i-1", "j", 1, [
        TrainerEvent(kind="checkpoint_committed", step=5, attempt=1),
        TrainerEvent(kind="resumed", step=5, attempt=2),  # kept for attempt 2
        TrainerEvent(kind="checkpoint_committed", step=10, attempt=2),
    ])  # fmt: skip
    old = _node(tmp_path, "i-2", "j", 1, [TrainerEvent(kind="checkpoint_committed", step=3)])  # before stamping
    other = _node(tmp_path, "i-3", "k", 1, [TrainerEvent(kind="resumed", step=1, attempt=1)])
    twin = SimpleNamespace(compute=SimpleNamespace(instances=lambda: [survivor, old, other]))
    by_attempt = _node_events(twin, "j")  # type: ignore[arg-type]
    assert {a: [(e.kind, e.step) for e in es] for a, es in by_attempt.items()} == {
        1: [("checkpoint_committed", 5), ("checkpoint_committed", 3)],
        2: [("resumed", 5), ("checkpoint_committed", 10)],
    }
