"""A global batch other than the checkpoint's is refused before training unless the run opts in.

The global batch defines the run (which samples make a step, what a step of the LR schedule
means); a resume keeps the recorded one at any world size, and an explicit other one used to be
taken with only a log line. Real torch sessions, one process, no dist (the plain resume at another
world size: tests/integration/test_checkpoint_resume_elastic.py).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from agent.batching import BatchPlan, GlobalBatchSampler, plan_batch
from agent.training import Session, spotrelay_session
from spotrelay.contracts.control import ENV_ALLOW_GLOBAL_BATCH_CHANGE, read_events
from spotrelay.errors import IncompatibleCheckpointError

SIZE = 24


def _digest(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(folder)).encode() + path.read_bytes())
    return digest.hexdigest()


def _session(ckpt: Path, plan: BatchPlan, **config: Any) -> tuple[Session, torch.optim.Optimizer, Any]:
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    data = TensorDataset(torch.zeros(SIZE, 2), torch.arange(SIZE))
    loader = DataLoader(data, batch_sampler=GlobalBatchSampler(SIZE, plan, seed=3))
    session = spotrelay_session(model, optimizer, lr_scheduler=scheduler, dataloader=loader, checkpoint_dir=ckpt,
                                **config)  # fmt: skip
    return session, optimizer, scheduler


def _run(session: Session, optimizer: torch.optim.Optimizer, scheduler: Any, steps: int) -> list[list[int]]:
    """Train to ``steps``; the samples each step used (in order)."""
    used: dict[int, list[int]] = {}
    for step, micro, (_x, index) in session.micro_steps(steps):
        used.setdefault(step, []).extend(index.tolist())
        if micro == session.accumulation - 1:
            optimizer.step()
            scheduler.step()
            session.step_done(0.0)
    assert session.close() == 0
    return [used[s] for s in sorted(used)]


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    """2 steps of global batch 4 (2 micro-batches of 2) saved at step 2."""
    ckpt = tmp_path / "ckpt"
    session, optimizer, scheduler = _session(ckpt, plan_batch(2, 4, checkpoint_dir=ckpt))
    _run(session, optimizer, scheduler, 2)
    return ckpt


def test_an_explicit_other_global_batch_is_refused_naming_the_checkpoint_and_what_to_do(saved: Path) -> None:
    control = saved.parent / "control"
    before = _digest(saved)
    with pytest.raises(IncompatibleCheckpointError) as err:
        plan_batch(2, 8, checkpoint_dir=saved, control_dir=control)
    text = str(err.value)
    assert text.startswith(f"{saved / 'step-00000002'}: trained with global batch 4, this run asks for 8;")
    assert "resume without a global batch to keep 4" in text and "SPOTRELAY_ALLOW_GLOBAL_BATCH_CHANGE=1" in text
    events, _ = read_events(control)
    assert [(e.kind, e.detail) for e in events] == [("refused", text)]  # the agent reports exit 80
    assert plan_batch(2, 4, checkpoint_dir=saved).global_batch == 4  # the same one, given explicitly
    assert plan_batch(1, checkpoint_dir=saved) == BatchPlan(4, 1, 1)  # no flag: the recorded one, any micro-batch
    assert _digest(saved) == before


def test_a_hand_built_plan_with_another_batch_is_refused_before_anything_loads(saved: Path) -> None:
    before = _digest(saved)
    session, _, _ = _session(saved, BatchPlan(8, 2, 1))
    with pytest.raises(IncompatibleCheckpointError, match="trained with global batch 4, this run asks for 8"):
        session.resume()
    assert session.step == 0 and session.resumed_from is None
    session.close()
    assert _digest(saved) == before


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_with_the_opt_in_the_order_goes_on_from_the_cursor_and_the_schedule_by_step(
    saved: Path, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    order = GlobalBatchSampler(SIZE, BatchPlan(4, 2, 1), seed=3).order(0)
    if how == "environment":
        monkeypatch.setenv(ENV_ALLOW_GLOBAL_BATCH_CHANGE, "1")
        plan = plan_batch(2, 8, checkpoint_dir=saved)
    else:
        plan = plan_batch(2, 8, checkpoint_dir=saved, allow_global_batch_change=True)
    session, optimizer, scheduler = _session(saved, plan)
    used = _run(session, optimizer, scheduler, 5)
    assert session.resumed_from == 2
    # steps 0-1 took order[0:8] in batches of 4; from the cursor (8) on, batches of 8, epoch 0's tail
    # (24 - 8 = 16 samples, two steps) in the same global order, then epoch 1 from its start
    assert used[:2] == [order[8:16], order[16:24]]
    epoch1 = GlobalBatchSampler(SIZE, plan, seed=3).order(1)
    assert used[2] == epoch1[:8]
    assert session.samples == 2 * 4 + 3 * 8
    assert scheduler.last_epoch == 5 and optimizer.param_groups[0]["lr"] == pytest.approx(0.5**5)
