"""When the final save of a notice window cannot commit, the notice-time snapshot is what counts."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from agent.checkpoint.config import SessionConfig
from agent.checkpoint.pipeline import Topology
from agent.training import Session
from spotrelay.contracts.control import read_events
from spotrelay.contracts.exit_codes import ExitCode


@dataclass
class Save:
    error: BaseException | None = None
    started: float = 0.0
    nbytes: int = 1
    emergency: bool = True
    flush_s: float = 1.0
    done: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.done.set()  # finished (committed, or failed with ``error``)


def _session(tmp_path: Path) -> Session:
    """Only what the stop path reads: no engine, no pipeline, no process group."""
    session = object.__new__(Session)
    session.config = SessionConfig(control_dir=tmp_path, checkpoint_dir=tmp_path / "ckpt")
    session.topo, session._device, session.step = Topology(), "cpu", 57
    return session


def test_a_failed_final_save_falls_back_to_the_notice_snapshot(tmp_path: Path) -> None:
    session = _session(tmp_path)
    final, snapshot = Save(error=RuntimeError("upload timed out")), Save()
    assert session._stop_after(final, time.time() + 5, "r1", fallback=snapshot) is True
    assert session.exit_code == ExitCode.PREEMPTED_SAVED  # nothing before the notice is lost
    events, _ = read_events(tmp_path)
    assert [(e.kind, e.step, e.request_id) for e in events] == [("stopping", 57, "r1")]


def test_unsaved_only_when_neither_save_committed(tmp_path: Path) -> None:
    session = _session(tmp_path)
    final, snapshot = Save(error=RuntimeError("boom")), Save(error=RuntimeError("also"))
    session._stop_after(final, time.time() + 5, "r1", fallback=snapshot)
    assert session.exit_code == ExitCode.PREEMPTED_UNSAVED
    session._stop_after(Save(), time.time() + 5, "r1", fallback=snapshot)
    assert session.exit_code == ExitCode.PREEMPTED_SAVED  # the final save alone is enough
