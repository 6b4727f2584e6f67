"""What the demo reads from the nodes' records to time a fault (spotrelay/local/fault_timing.py)."""

from __future__ import annotations

import json
from pathlib import Path

from spotrelay.contracts.control import TrainerEvent
from spotrelay.local.fault_timing import agent_start, resumed_after, stop_after_notice


def ev(kind: str, step: int, t: float, attempt: int, world: int = 2, **kw: object) -> TrainerEvent:
    return TrainerEvent(kind=kind, step=step, time=t, attempt=attempt, world_size=world, **kw)  # type: ignore[arg-type]


def test_training_is_back_at_the_next_attempts_first_full_size_step() -> None:
    events = [
        ev("first_step", 1, 10.0, 1),
        ev("checkpoint_committed", 22, 52.0, 1, emergency=True, duration_s=1.0, deadline=80.0),
        ev("checkpoint_committed", 80, 76.0, 1, emergency=True, duration_s=2.0, deadline=80.0),
        # a survivor's old progress is no resume: only a later attempt's first step counts
        ev("resumed", 80, 95.0, 2), ev("first_step", 81, 97.0, 2),
        ev("resumed", 80, 96.0, 2), ev("first_step", 81, 97.1, 2),
        ev("resumed", 100, 150.0, 3, world=1), ev("first_step", 101, 151.0, 3, world=1),  # smaller gang
        ev("resumed", 100, 160.0, 4), ev("first_step", 101, 162.0, 4),
    ]
    assert stop_after_notice(events, 1) == (74.0, 76.0, 80.0)
    back = resumed_after(events, 1, 74.0)
    assert back is not None and (back.at, back.attempt, back.from_step) == (97.0, 2, 80)
    back = resumed_after(events, 2, 120.0)  # the loss in attempt 2: attempt 3 ran at 1 rank, 4 at full size
    assert back is not None and (back.at, back.attempt, back.from_step) == (162.0, 4, 100)
    assert resumed_after(events, 4, 170.0) is None


def test_a_nodes_start_up_from_its_agent_log(tmp_path: Path) -> None:
    lines = [{"ts": 5.0, "msg": "published NodeReady"},
             {"ts": 6.0, "msg": "waiting for the previous gang's emergency save (ranks [1])"},
             {"ts": 30.0, "msg": "launching", "argv": []}, {"ts": 90.0, "msg": "launching"}]
    (tmp_path / "agent.log").write_text("not json\n" + "\n".join(json.dumps(x) for x in lines) + "\n")
    assert agent_start(tmp_path) == (6.0, 30.0)
    (tmp_path / "agent.log").write_text(json.dumps({"ts": 7.0, "msg": "launching"}) + "\n")
    assert agent_start(tmp_path) == (7.0, 7.0)  # not gated: ready when it started
    assert agent_start(tmp_path / "none") == (None, None)
