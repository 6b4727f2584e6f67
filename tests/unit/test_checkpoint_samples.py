"""The manifest's ``samples``: what the whole run trained on, all ranks together, at any world size.

Format 1 recorded rank 0's own count (meaningless after a resize); a format-1 manifest and trainer
file still load, converted to the global count. Real torch sessions, one process, no dist (the
2 -> 1 -> 3 rank counts are checked in tests/integration/test_checkpoint_resume_elastic.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

from agent.batching import GlobalBatchSampler, plan_batch
from agent.checkpoint.manifest import MANIFEST, Manifest, sha256_file, step_name
from agent.checkpoint.state import load_trainer_state, save_trainer_state, trainer_file
from agent.training import Session, spotrelay_session


def _manifest_json(**fields: object) -> str:
    base: dict[str, object] = {"step": 6, "engine": "dcp", "world_size": 2, "ranks": [0, 1], "shards": []}
    return json.dumps({**base, **fields})


def test_a_format_1_manifest_reads_as_the_global_count() -> None:
    planned = Manifest.model_validate_json(
        _manifest_json(format=1, samples=18, data_state={"samples": 18, "global_batch": 12, "step": 6})
    )
    assert planned.samples == 72 and planned.data_state["samples"] == 72  # 6 steps of 12, whatever rank 0 saw
    assert Manifest.model_validate_json(_manifest_json(format=1, samples=18)).samples == 36  # 2 ranks alike
    assert Manifest.model_validate_json(_manifest_json(format=2, samples=18)).samples == 18
    assert Manifest.model_validate_json(planned.model_dump_json()).samples == 72  # written back as format 2


def _model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def _train(session: Session, model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int, n: int) -> None:
    for _ in session.steps(steps):
        optimizer.zero_grad()
        model(torch.ones(n, 4)).sum().backward()
        optimizer.step()
        session.step_done(0.5, samples=n)


def _manifest(ckpt: Path, step: int) -> dict[str, object]:
    return dict(json.loads((ckpt / step_name(step) / MANIFEST).read_text()))


def test_without_a_batch_plan_the_count_is_the_reported_samples_times_the_world(tmp_path: Path) -> None:
    model, optimizer = _model()
    session = spotrelay_session(model, optimizer, checkpoint_dir=tmp_path, every_steps=2)
    _train(session, model, optimizer, 4, n=3)
    assert session.close() == 0
    assert [_manifest(tmp_path, s)["samples"] for s in (2, 4)] == [6, 12]
    assert _manifest(tmp_path, 4)["format"] == 2


def test_with_a_batch_plan_each_step_counts_the_global_batch(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    plan = plan_batch(2, 6, checkpoint_dir=tmp_path)  # 1 rank: 3 micro-batches of 2 a step
    data = TensorDataset(torch.randn(24, 4))
    loader = DataLoader(data, batch_sampler=GlobalBatchSampler(24, plan, seed=1))
    session = spotrelay_session(model, optimizer, dataloader=loader, checkpoint_dir=tmp_path, every_steps=5)
    for _step, micro, (x,) in session.micro_steps(5):  # more than one epoch (4 steps)
        model(x).sum().backward()
        if micro == session.accumulation - 1:
            optimizer.step()
            optimizer.zero_grad()
            session.step_done(0.5, samples=1)  # whatever the script reports: the plan decides
    assert session.close() == 0
    manifest = _manifest(tmp_path, 5)
    assert manifest["samples"] == 30 and manifest["data_state"]["samples"] == 30  # type: ignore[index]


def _make_format_1(ckpt: Path, step: int, per_rank: int, global_batch: int) -> None:
    """Rewrite a committed step the way format 1 wrote it after a resize: rank 0's count (not the
    global one), no ``samples_global``; the global batch recorded."""
    step_dir = ckpt / step_name(step)
    state_path = trainer_file(step_dir, 0)
    state = load_trainer_state(state_path)
    state.update(samples=per_rank, global_batch=global_batch)
    del state["samples_global"]
    save_trainer_state(state_path, state)
    manifest = json.loads((step_dir / MANIFEST).read_text())
    size, digest = sha256_file(state_path)
    for shard in manifest["shards"]:
        if shard["path"] == "trainer/rank-0.pt":
            shard.update(size=size, sha256=digest)
    manifest.update(format=1, samples=per_rank)
    manifest["data_state"].update(samples=per_rank, global_batch=global_batch)
    (step_dir / MANIFEST).write_text(json.dumps(manifest))


def test_an_old_checkpoint_still_resumes_and_carries_on_with_the_global_count(tmp_path: Path) -> None:
    model, optimizer = _model()
    session = spotrelay_session(model, optimizer, checkpoint_dir=tmp_path)
    _train(session, model, optimizer, 2, n=3)
    assert session.close() == 0
    _make_format_1(tmp_path, 2, per_rank=5, global_batch=3)
    assert Manifest.model_validate_json((tmp_path / step_name(2) / MANIFEST).read_text()).samples == 6

    model, optimizer = _model()
    resumed = spotrelay_session(model, optimizer, checkpoint_dir=tmp_path)
    assert resumed.resume() == 2 and resumed.samples == 6  # 2 steps of 3, not rank 0's 5
    _train(resumed, model, optimizer, 4, n=3)
    assert resumed.close() == 0
    assert _manifest(tmp_path, 4)["samples"] == 12 and _manifest(tmp_path, 4)["format"] == 2
