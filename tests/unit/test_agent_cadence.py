"""``checkpoint.every_minutes: auto`` on the trainer's side: the settings from the agent's environment,
the interval from this rank's measured saves (agent/cadence.py), and a real torch session saving more
often when losses come often. One process, no dist; the session's clock is its test seam."""

from __future__ import annotations

import json
import math
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

import agent.training as training
from agent.cadence import PRIOR_STALL_S, AutoCadence
from agent.checkpoint.config import SessionConfig
from agent.checkpoint.manifest import MANIFEST
from agent.training import spotrelay_session
from spotrelay.contracts import control as c


# --- the settings ------------------------------------------------------------------------------------
def test_the_environment_gives_auto_its_loss_interval_and_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(c.ENV_CHECKPOINT_EVERY_MINUTES, "auto")
    monkeypatch.setenv(c.ENV_CHECKPOINT_LOSS_INTERVAL_S, "7200.5")
    monkeypatch.setenv(c.ENV_CHECKPOINT_AUTO_MIN_MINUTES, "3")
    monkeypatch.setenv(c.ENV_CHECKPOINT_AUTO_MAX_MINUTES, "45")
    cfg = SessionConfig.from_env(every_minutes=10.0)  # the agent's environment wins over the script
    assert cfg.auto and cfg.fixed_minutes is None
    assert (cfg.loss_interval_s, cfg.auto_min_minutes, cfg.auto_max_minutes) == (7200.5, 3.0, 45.0)
    monkeypatch.delenv(c.ENV_CHECKPOINT_LOSS_INTERVAL_S)  # no loss expected
    assert SessionConfig.from_env().loss_interval_s is None


def test_the_script_may_ask_for_auto_and_a_number_stays_a_number(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (c.ENV_CHECKPOINT_EVERY_MINUTES, c.ENV_CHECKPOINT_AUTO_MIN_MINUTES, c.ENV_CHECKPOINT_AUTO_MAX_MINUTES):
        monkeypatch.delenv(name, raising=False)
    cfg = SessionConfig.from_env(every_minutes="auto")
    assert cfg.auto and (cfg.auto_min_minutes, cfg.auto_max_minutes) == (2.0, 60.0)  # the spec's defaults
    monkeypatch.setenv(c.ENV_CHECKPOINT_EVERY_MINUTES, "15")
    fixed = SessionConfig.from_env(every_minutes="auto")
    assert not fixed.auto and fixed.fixed_minutes == 15.0


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        (c.ENV_CHECKPOINT_EVERY_MINUTES, "soon", "minutes or 'auto'"),
        (c.ENV_CHECKPOINT_LOSS_INTERVAL_S, "1h", "a number"),
        (c.ENV_CHECKPOINT_AUTO_MAX_MINUTES, "x", "a number"),
        (c.ENV_CHECKPOINT_EVERY_STEPS, "1e3", "a whole number"),
    ],
)
def test_a_malformed_value_names_its_variable(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, expected: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=f"^{name}={value!r}: expected {expected}$"):
        SessionConfig.from_env()


def test_inverted_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="auto_min_minutes is above auto_max_minutes"):
        SessionConfig(every_minutes="auto", auto_min_minutes=30, auto_max_minutes=10)


# --- the interval from this rank's saves ------------------------------------------------------------
@dataclass
class FakeSave:
    emergency: bool = False
    flush_s: float = 0.0
    started: float = 0.0
    nbytes: int = 1
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)


def test_before_its_first_save_a_rank_uses_the_prior_stall_then_its_own() -> None:
    cadence = AutoCadence(loss_interval_s=3600.0, min_s=60.0, max_s=3600.0)
    assert cadence.interval_s == pytest.approx(math.sqrt(2 * PRIOR_STALL_S * 3600))
    cadence.saved(FakeSave(), stall_s=8.0)  # the first measurement replaces the prior
    assert cadence.interval_s == pytest.approx(math.sqrt(2 * 8.0 * 3600))  # 240 s
    cadence.saved(FakeSave(), stall_s=2.0)  # then a running estimate: one quick save is not the rule
    assert cadence.stall_s == pytest.approx(5.0)


def test_a_short_loss_interval_saves_more_often_within_the_bounds() -> None:
    often = AutoCadence(loss_interval_s=1800.0, min_s=120.0, max_s=3600.0)
    rarely = AutoCadence(loss_interval_s=20 * 3600.0, min_s=120.0, max_s=3600.0)
    never = AutoCadence(loss_interval_s=None, min_s=120.0, max_s=3600.0)
    for cadence in (often, rarely, never):
        cadence.saved(FakeSave(), stall_s=10.0)
    assert often.interval_s == pytest.approx(math.sqrt(2 * 10 * 1800))  # 190 s
    assert rarely.interval_s == pytest.approx(math.sqrt(2 * 10 * 72000))  # 1200 s
    assert never.interval_s == 3600.0  # no loss expected: the ceiling
    stormy = AutoCadence(loss_interval_s=60.0, min_s=120.0, max_s=3600.0)
    stormy.saved(FakeSave(), stall_s=10.0)
    assert stormy.interval_s == 120.0  # sqrt(1200) = 35 s: the floor


def test_the_last_periodic_upload_raises_the_floor_an_emergency_does_not() -> None:
    cadence = AutoCadence(loss_interval_s=1800.0, min_s=60.0, max_s=3600.0)
    periodic, emergency = FakeSave(flush_s=400.0), FakeSave(emergency=True, flush_s=900.0)
    cadence.saved(periodic, stall_s=1.0)
    cadence.saved(emergency, stall_s=1.0)
    cadence.boundary()
    assert cadence.floor_s == 60.0  # not committed yet: not learned
    periodic.done.set()
    emergency.done.set()
    cadence.boundary()
    assert cadence.floor_s == 400.0 and cadence.interval_s == 400.0  # sqrt(2 x 1 x 1800) = 60 s < the upload
    failed = FakeSave(flush_s=5.0, error=RuntimeError("S3"))
    cadence.saved(failed, stall_s=1.0)
    failed.done.set()
    cadence.boundary()
    assert cadence.floor_s == 400.0  # a failed save teaches nothing


def test_the_interval_is_reported_when_it_moves_materially() -> None:
    cadence = AutoCadence(loss_interval_s=3600.0, min_s=1.0, max_s=3600.0)
    assert cadence.boundary() == pytest.approx(math.sqrt(2 * PRIOR_STALL_S * 3600))  # the first one
    assert cadence.boundary() is None
    cadence.saved(FakeSave(), stall_s=1.05)  # +2.5 %: not worth a line
    assert cadence.boundary() is None
    cadence.saved(FakeSave(), stall_s=4.0)
    assert cadence.boundary() == pytest.approx(cadence.interval_s)


# --- a real session ---------------------------------------------------------------------------------
def _saved_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, loss_interval_s: float | None, steps: int = 12
) -> list[int]:
    """Train a tiny model, one minute of the session's clock a step; the steps that were saved."""
    for name in (c.ENV_CHECKPOINT_EVERY_MINUTES, c.ENV_CHECKPOINT_LOSS_INTERVAL_S, c.ENV_CHECKPOINT_EVERY_STEPS):
        monkeypatch.delenv(name, raising=False)
    clock = [0.0]
    monkeypatch.setattr(training, "_monotonic", lambda: clock[0])
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    session = spotrelay_session(model, optimizer, checkpoint_dir=tmp_path, every_minutes="auto", keep_local=100,
                                loss_interval_s=loss_interval_s, auto_min_minutes=1, auto_max_minutes=10)  # fmt: skip
    for _ in session.steps(steps):
        optimizer.zero_grad()
        model(torch.ones(2, 4)).sum().backward()
        optimizer.step()
        session.step_done(0.5)
        clock[0] += 60.0
    assert session.close() == 0
    return sorted(json.loads(m.read_text())["step"] for m in tmp_path.glob(f"*/{MANIFEST}"))


def test_a_session_saves_every_minute_when_losses_come_often_and_at_the_ceiling_when_none_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a loss every 10 minutes: sqrt(2 x a tiny model's stall x 600 s) is far below the 1-minute floor
    assert _saved_steps(tmp_path / "often", monkeypatch, 600.0) == list(range(1, 13))
    # no loss expected, or one so rare that the optimum is above it: the 10-minute ceiling (and the final save)
    assert _saved_steps(tmp_path / "never", monkeypatch, None) == [10, 12]
    assert _saved_steps(tmp_path / "rarely", monkeypatch, 1e9) == [10, 12]
