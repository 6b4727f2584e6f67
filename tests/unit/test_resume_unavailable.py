"""A session whose checkpoints cannot be read now (CheckpointUnavailableError) asks again after
``RESUME_RETRY_S`` and resumes once they can; when they never can, it raises after the last wait,
records the ``unavailable`` event (the agent reports INFRA_ERROR) and has not trained from step 0.
The failure is injected at the resume's agreement (``agree_on_step``: what S3 answers is covered
with moto's server in tests/integration/test_checkpoint_s3.py); the checkpoints are real."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import agent.session_resume as training
from agent.training import spotrelay_session
from spotrelay.contracts.control import read_events
from spotrelay.errors import CheckpointUnavailableError


def _session(ckpt: Path, control: Path | None = None) -> tuple[Any, Any, Any]:
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    session = spotrelay_session(model, optimizer, checkpoint_dir=ckpt, every_steps=1, keep_local=5,
                                control_dir=control)  # fmt: skip
    return session, model, optimizer


def _train(ckpt: Path, steps: int) -> None:
    session, model, optimizer = _session(ckpt)
    for _ in session.steps(steps):
        model(torch.ones(1, 2)).sum().backward()
        optimizer.step()
    assert session.close() == 0


@pytest.fixture
def flaky(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """agree_on_step failing ``fail`` times as every rank sees it, then the real one; sleeps recorded."""
    state: dict[str, Any] = {"fail": 0, "calls": 0, "slept": []}
    real = training.agree_on_step

    def agree(*args: Any) -> int | None:
        state["calls"] += 1
        if state["calls"] <= state["fail"]:
            raise CheckpointUnavailableError("no checkpoint could be read now: step-00000002 unusable: s3: "
                                             "download failed (connection reset)")
        return real(*args)

    monkeypatch.setattr(training, "agree_on_step", agree)
    monkeypatch.setattr(training, "_sleep", lambda s: state["slept"].append(s))
    return state


def test_a_blip_is_waited_out_and_the_resume_goes_on(tmp_path: Path, flaky: dict[str, Any]) -> None:
    ckpt = tmp_path / "ckpt"
    _train(ckpt, 2)
    flaky.update(fail=len(training.RESUME_RETRY_S), calls=0)  # every wait used, then S3 answers
    session, _, _ = _session(ckpt)
    assert session.resume() == 2
    assert flaky["slept"] == list(training.RESUME_RETRY_S)
    session.close()


def test_checkpoints_never_readable_end_the_attempt_without_starting_over(
    tmp_path: Path, flaky: dict[str, Any]
) -> None:
    ckpt, control = tmp_path / "ckpt", tmp_path / "control"
    _train(ckpt, 2)
    before = sorted(p.name for p in ckpt.iterdir())
    flaky.update(fail=99, calls=0)
    session, _, _ = _session(ckpt, control)
    with pytest.raises(CheckpointUnavailableError, match="no checkpoint could be read now"):
        list(session.steps(4))  # resumes first: raised, no step trained from 0
    assert session.step == 0 and session.resumed_from is None
    assert flaky["calls"] == len(training.RESUME_RETRY_S) + 1
    events, _ = read_events(control)
    assert [(e.kind, e.detail.split(":")[0]) for e in events] == [("unavailable", "no checkpoint could be read now")]
    session.close()
    assert sorted(p.name for p in ckpt.iterdir()) == before  # nothing saved or pruned
