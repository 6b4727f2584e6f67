"""The local commit protocol: parts, manifest, latest pointer, verification, fallback, retention."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from agent.checkpoint.engines import Snapshot
from agent.checkpoint.local_tier import LocalTier
from agent.checkpoint.manifest import MANIFEST, step_name
from agent.checkpoint.pipeline import Pipeline, SaveJob, Topology
from agent.checkpoint.restore import choose
from spotrelay.contracts.control import read_events


def _save(pipeline: Pipeline, local: LocalTier, step: int) -> SaveJob:
    step_dir = local.step_dir(step)

    def write() -> list[Path]:
        step_dir.mkdir(parents=True, exist_ok=True)
        path = step_dir / "model.pt"
        torch.save({"w": torch.full((256,), float(step))}, path)
        return [path]

    job = SaveJob(
        step=step, snapshot=Snapshot(write=write), trainer_state={"step": step}, manifest_fields={"engine": "fake"}
    )
    pipeline.submit(job)
    assert job.done.wait(300), "the save did not finish in 300 s (a hang)"
    assert job.error is None, job.error
    return job


@pytest.fixture
def tier(tmp_path: Path) -> Iterator[tuple[Pipeline, LocalTier, Path]]:
    local = LocalTier(tmp_path / "ckpt")
    control = tmp_path / "control"
    pipeline = Pipeline(local, None, Topology(), control, keep_local=3)
    yield pipeline, local, control
    pipeline.close()


def test_commit_writes_manifest_then_latest_and_reports(tier: tuple[Pipeline, LocalTier, Path]) -> None:
    pipeline, local, control = tier
    _save(pipeline, local, 2)
    _save(pipeline, local, 4)
    assert local.latest() == 4
    manifest = local.verified(4)
    assert manifest.complete and {s.path for s in manifest.shards} == {"model.pt", "trainer/rank-0.pt"}
    assert all(len(s.sha256) == 64 and s.size > 0 for s in manifest.shards)
    events, _ = read_events(control)
    assert [(e.kind, e.step) for e in events] == [("checkpoint_committed", 2), ("checkpoint_committed", 4)]
    assert events[1].uri == str(local.step_dir(4))
    chosen = choose(local, None)
    assert chosen is not None and chosen.step == 4


def test_corrupt_shard_falls_back_to_previous(
    tier: tuple[Pipeline, LocalTier, Path], caplog: pytest.LogCaptureFixture
) -> None:
    pipeline, local, _ = tier
    _save(pipeline, local, 2)
    _save(pipeline, local, 4)
    shard = local.step_dir(4) / "model.pt"
    data = bytearray(shard.read_bytes())
    data[-100] ^= 0xFF  # same size, different bytes: only the checksum can tell
    shard.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="spotrelay.checkpoint"):
        chosen = choose(local, None)
    assert chosen is not None and chosen.step == 2
    assert "step-00000004" in caplog.text and "sha256" in caplog.text


def test_missing_shard_falls_back(tier: tuple[Pipeline, LocalTier, Path], caplog: pytest.LogCaptureFixture) -> None:
    pipeline, local, _ = tier
    _save(pipeline, local, 2)
    _save(pipeline, local, 4)
    (local.step_dir(4) / "trainer" / "rank-0.pt").unlink()
    with caplog.at_level(logging.WARNING, logger="spotrelay.checkpoint"):
        chosen = choose(local, None)
    assert chosen is not None and chosen.step == 2
    assert "missing" in caplog.text


def test_step_without_manifest_is_ignored(tier: tuple[Pipeline, LocalTier, Path]) -> None:
    pipeline, local, _ = tier
    _save(pipeline, local, 2)
    _save(pipeline, local, 6)
    (local.step_dir(6) / MANIFEST).unlink()  # a crash between the shards and the manifest
    assert local.steps() == [2]
    chosen = choose(local, None)
    assert chosen is not None and chosen.step == 2


def test_unreadable_manifest_is_skipped(tier: tuple[Pipeline, LocalTier, Path]) -> None:
    pipeline, local, _ = tier
    _save(pipeline, local, 2)
    _save(pipeline, local, 4)
    (local.step_dir(4) / MANIFEST).write_text('{"step": 4, "shards": [')
    chosen = choose(local, None)
    assert chosen is not None and chosen.step == 2


def test_retention_keeps_newest_k(tier: tuple[Pipeline, LocalTier, Path]) -> None:
    pipeline, local, _ = tier
    (local.root / step_name(1)).mkdir(parents=True)  # an abandoned, never-committed folder
    for step in (2, 4, 6, 8, 10):
        _save(pipeline, local, step)
    assert local.steps() == [10, 8, 6]
    assert sorted(p.name for p in local.root.iterdir() if p.name.startswith("step-")) == [
        step_name(6),
        step_name(8),
        step_name(10),
    ]


def test_nothing_to_resume_from(tmp_path: Path) -> None:
    assert choose(LocalTier(tmp_path / "empty"), None) is None
