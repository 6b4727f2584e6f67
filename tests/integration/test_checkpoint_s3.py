"""The S3 tier against moto's server: commit order, resume on a fresh node, crash mid-upload, retention."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from botocore.exceptions import EndpointConnectionError

from agent.checkpoint.engines import Snapshot
from agent.checkpoint.local_tier import LocalTier
from agent.checkpoint.pipeline import Pipeline, SaveJob, Topology
from agent.checkpoint.restore import agree_on_step, choose
from agent.checkpoint.s3_tier import MiB, S3Tier
from spotrelay.adapters import aws as aws_clients
from spotrelay.contracts.control import read_events
from spotrelay.errors import CheckpointFormatError, CheckpointUnavailableError, CorruptCheckpointError


class FaultyClient:
    """The real S3 client, except that upload_part fails once ``armed`` (a crash mid-upload)."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.armed = False
        self.parts = 0
        self._lock = threading.Lock()

    def upload_part(self, **kwargs: Any) -> Any:
        with self._lock:
            self.parts += 1
            if self.armed and self.parts % 2 == 0:
                raise ConnectionError("simulated crash mid-upload")
        return self.real.upload_part(**kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


class Unreachable:
    """The real S3 client, except that the calls ``broken`` names fail as a lost connection does."""

    def __init__(self, real: Any, *broken: str) -> None:
        self.real, self.broken = real, set(broken)

    def __getattr__(self, name: str) -> Any:
        if name in self.broken:
            def fail(*args: Any, **kwargs: Any) -> Any:
                raise EndpointConnectionError(endpoint_url="http://127.0.0.1:9")
            return fail
        return getattr(self.real, name)


def _tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else []


def _save(pipeline: Pipeline, local: LocalTier, step: int, numel: int = 3 * MiB) -> SaveJob:
    step_dir = local.step_dir(step)

    def write() -> list[Any]:
        step_dir.mkdir(parents=True, exist_ok=True)
        path = step_dir / "model.pt"
        torch.save({"w": torch.full((numel,), float(step))}, path)  # 12 MiB: a 3-part multipart upload
        return [path]

    job = SaveJob(
        step=step, snapshot=Snapshot(write=write), trainer_state={"step": step}, manifest_fields={"engine": "fake"}
    )
    pipeline.submit(job)
    assert job.done.wait(300)
    return job


@pytest.fixture
def s3_setup(aws: dict[str, str], tmp_path: Path) -> Any:
    faulty = FaultyClient(aws_clients.client("s3"))
    s3 = S3Tier(f"s3://{aws['bucket']}/checkpoints/job-1", client=lambda: faulty, part_size=5 * MiB)
    local = LocalTier(tmp_path / "node-a")
    pipeline = Pipeline(local, s3, Topology(), tmp_path / "control", keep_local=2, keep_s3=2, timeout_s=30)
    yield pipeline, local, s3, faulty
    pipeline.close()


def test_commit_to_s3_then_resume_on_a_fresh_node(s3_setup: Any, tmp_path: Path) -> None:
    pipeline, local, s3, faulty = s3_setup
    for step in (2, 4):
        assert _save(pipeline, local, step).error is None
    assert faulty.parts >= 3  # the shard went up as a multipart upload
    assert s3.latest() == 4 and s3.steps() == [4, 2]
    events, _ = read_events(tmp_path / "control")
    assert events[-1].uri == f"{s3.uri}/step-00000004"
    fresh = LocalTier(tmp_path / "node-b")
    manifest = choose(fresh, s3)
    assert manifest is not None and manifest.step == 4
    # the committing rank reports the whole checkpoint's size (the controller weighs moving it: placement.md)
    assert events[-1].total_bytes == manifest.total_bytes > 12 * MiB
    assert (fresh.step_dir(4) / "model.pt").read_bytes() == (local.step_dir(4) / "model.pt").read_bytes()


def test_crash_during_upload_keeps_previous_latest(s3_setup: Any, tmp_path: Path) -> None:
    pipeline, local, s3, faulty = s3_setup
    assert _save(pipeline, local, 2).error is None
    faulty.armed = True
    job = _save(pipeline, local, 4)
    assert isinstance(job.error, ConnectionError)
    assert s3.latest() == 2
    assert s3.steps() == [2]
    assert s3.manifest(4) is None
    uploads = s3.client.list_multipart_uploads(Bucket=s3.bucket).get("Uploads", [])
    assert uploads == []  # the failed upload was aborted, not left half-written
    fresh = LocalTier(tmp_path / "node-b")
    manifest = choose(fresh, s3)
    assert manifest is not None and manifest.step == 2


def test_corrupt_object_in_s3_falls_back(s3_setup: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    pipeline, local, s3, _ = s3_setup
    for step in (2, 4):
        assert _save(pipeline, local, step).error is None
    key = s3.key("step-00000004/trainer/rank-0.pt")
    s3.client.put_object(Bucket=s3.bucket, Key=key, Body=b"not the bytes the manifest hashed")
    with caplog.at_level(logging.WARNING, logger="spotrelay.checkpoint"):
        manifest = choose(LocalTier(tmp_path / "node-b"), s3)
    assert manifest is not None and manifest.step == 2
    assert "step-00000004" in caplog.text


class TwoRanks:
    """The two collectives resume uses (a broadcast from rank 0, an all-ranks AND), for two ranks
    played by two threads of this process."""

    def __init__(self) -> None:
        self.barrier = threading.Barrier(2, timeout=300)  # only catches a hang
        self.shared: list[int | str | None] = [None]  # a step, or a refusal's message
        self.flags: dict[int, bool] = {}

    def share(self, rank: int, step: int | str | None) -> int | str | None:
        if rank == 0:
            self.shared[0] = step
        self.barrier.wait()
        value = self.shared[0]
        self.barrier.wait()
        return value

    def every(self, rank: int, ok: bool) -> bool:
        self.flags[rank] = ok
        self.barrier.wait()
        result = all(self.flags.values())
        self.barrier.wait()
        return result


def test_a_step_another_node_cannot_use_moves_every_rank_back(s3_setup: Any, tmp_path: Path) -> None:
    """Found by the chaos campaign: rank 0 verified step 4 in its own tier and chose it; the other
    node's download of it was corrupt, and that rank exited 1 (a user error: the job FAILED) instead
    of every rank falling back to step 2."""
    pipeline, local, s3, _ = s3_setup
    for step in (2, 4):
        assert _save(pipeline, local, step).error is None
    s3.client.put_object(Bucket=s3.bucket, Key=s3.key("step-00000004/model.pt"), Body=b"torn")
    group, chosen = TwoRanks(), {}

    def rank(r: int, node: LocalTier) -> None:
        chosen[r] = agree_on_step(r == 0, r != 0, node, s3, None, lambda step: group.share(r, step),
                                  lambda ok: group.every(r, ok))

    other = threading.Thread(target=rank, args=(1, LocalTier(tmp_path / "node-b")))
    other.start()
    rank(0, local)
    other.join(300)
    assert chosen == {0: 2, 1: 2}
    assert (tmp_path / "node-b" / "step-00000002" / "manifest.json").is_file()


def test_a_newer_manifest_format_in_s3_stops_every_rank_instead_of_falling_back(
    s3_setup: Any, tmp_path: Path
) -> None:
    """Rank 0 chooses step 4 from its own (format 2) copy; the other node fetches it from S3, where
    the manifest is of a newer format: both ranks raise it, neither falls back to step 2."""
    from agent.spare import SpareCache

    pipeline, local, s3, _ = s3_setup
    for step in (2, 4):
        assert _save(pipeline, local, step, numel=1024).error is None
    key = s3.key("step-00000004/manifest.json")
    text = s3.client.get_object(Bucket=s3.bucket, Key=key)["Body"].read().decode()
    s3.client.put_object(Bucket=s3.bucket, Key=key, Body=text.replace('"format": 2', '"format": 3').encode())
    group, raised = TwoRanks(), {}

    def rank(r: int, node: LocalTier) -> None:
        try:
            agree_on_step(r == 0, r != 0, node, s3, None, lambda step: group.share(r, step),
                          lambda ok: group.every(r, ok))  # fmt: skip
        except CheckpointFormatError as exc:
            raised[r] = str(exc)

    other = threading.Thread(target=rank, args=(1, LocalTier(tmp_path / "node-b")))
    other.start()
    rank(0, local)
    other.join(300)
    manifest = f"{s3.uri}/step-00000004/manifest.json"
    assert raised[1].startswith(f"{manifest}: manifest format 3, newer than this spotrelay reads (formats 1, 2)")
    assert raised[0] == f"{manifest}: another node read this manifest in a newer format than this spotrelay reads; " \
                        "upgrade spotrelay to resume it"
    assert not (tmp_path / "node-b" / "step-00000002").exists()  # no fallback download
    with pytest.raises(CheckpointFormatError):  # a fresh node choosing from S3 alone
        choose(LocalTier(tmp_path / "node-c"), s3)
    assert SpareCache(tmp_path / "spare", s3.uri).refresh() is None  # a spare does not mirror it


def test_s3_retention_prunes_beyond_keep(s3_setup: Any) -> None:
    pipeline, local, s3, _ = s3_setup
    for step in (2, 4, 6):
        assert _save(pipeline, local, step, numel=1024).error is None
    assert s3.steps() == [6, 4]
    assert s3.list_keys("step-00000002/") == []
    assert local.steps() == [6, 4]


def test_offloaded_helpers_commit_an_emergency_save_next_to_a_periodic_one(aws: dict[str, str], tmp_path: Path) -> None:
    s3 = S3Tier(f"s3://{aws['bucket']}/checkpoints/job-2")
    local = LocalTier(tmp_path / "node")
    pipeline = Pipeline(local, s3, Topology(), tmp_path / "control", timeout_s=60, offload=True)
    try:
        periodic = SaveJob(
            step=2, snapshot=Snapshot(write=_writer(local, 2)), trainer_state={}, manifest_fields={"engine": "fake"}
        )
        urgent = SaveJob(
            step=4, snapshot=Snapshot(write=_writer(local, 4)), trainer_state={}, manifest_fields={"engine": "fake"}
        )
        urgent.emergency = True
        pipeline.submit(periodic)
        pipeline.submit(urgent)
        assert urgent.done.wait(300) and urgent.error is None, urgent.error
        assert periodic.done.wait(300) and periodic.error is None, periodic.error
    finally:
        pipeline.close()
    assert s3.latest() == 4 and s3.steps() == [4, 2]
    manifest = s3.manifest(4)
    assert manifest is not None and {s.path for s in manifest.shards} == {"model.pt", "trainer/rank-0.pt"}
    events, _ = read_events(tmp_path / "control")
    assert {(e.step, e.emergency) for e in events} == {(2, False), (4, True)}
    fresh = LocalTier(tmp_path / "fresh")
    chosen = choose(fresh, S3Tier(s3.uri))  # (pipeline.close() shut the first tier's pool)
    assert chosen is not None and chosen.step == 4  # what the helpers hashed matches what they uploaded


def _writer(local: LocalTier, step: int) -> Any:
    def write() -> list[Path]:
        step_dir = local.step_dir(step)
        step_dir.mkdir(parents=True, exist_ok=True)
        torch.save({"w": torch.full((2 * MiB,), float(step))}, step_dir / "model.pt")
        return [step_dir / "model.pt"]

    return write


def test_a_helper_that_cannot_map_the_arena_falls_back_to_the_trainer(aws: dict[str, str], tmp_path: Path) -> None:
    """A host that hides /proc/<trainer>/fd from the helper must not lose the save: the trainer transfers it."""
    from agent.checkpoint.arena import Arena
    from agent.checkpoint.engines import ArenaFile

    arena = Arena(6 * MiB)
    arena.bytes.copy_(torch.arange(6 * MiB, dtype=torch.int64).to(torch.uint8))
    os.dup2(arena.fd, 987)  # "/proc/self/fd/987" is this process's arena, and nothing in the helper's
    s3 = S3Tier(f"s3://{aws['bucket']}/checkpoints/job-3")
    local = LocalTier(tmp_path / "node")
    pipeline = Pipeline(local, s3, Topology(), tmp_path / "control", timeout_s=60, offload=True)
    target = local.step_dir(8) / "model" / "__0_tensors.bin"
    shard = ArenaFile(path=target, arena="/proc/self/fd/987", segments=[(0, 6 * MiB)])
    try:
        job = SaveJob(
            step=8, snapshot=Snapshot(write=lambda: [shard]), trainer_state={}, manifest_fields={"engine": "x"}
        )
        job.emergency = True
        pipeline.submit(job)
        assert job.done.wait(300) and job.error is None, job.error
    finally:
        pipeline.close()
        os.close(987)
    assert s3.latest() == 8 and target.read_bytes() == bytes(arena.bytes.numpy())
    chosen = choose(LocalTier(tmp_path / "fresh"), S3Tier(s3.uri))
    assert chosen is not None and chosen.step == 8  # uploaded bytes match the recorded sha256
    arena.close()


def test_a_hot_spare_mirrors_the_newest_commit_into_its_local_tier(s3_setup: Any, tmp_path: Path) -> None:
    from agent.spare import SpareCache

    pipeline, local, s3, _ = s3_setup
    spare = SpareCache(tmp_path / "spare", s3.uri, keep=1)
    assert spare.refresh() is None  # nothing committed yet
    for step in (2, 4):
        assert _save(pipeline, local, step, numel=1024).error is None
        assert spare.refresh() == step
    assert spare.local.steps() == [4]  # keeps only the newest: what a takeover restores
    assert (spare.local.step_dir(4) / "model.pt").read_bytes() == (local.step_dir(4) / "model.pt").read_bytes()
    assert choose(LocalTier(tmp_path / "spare"), None) is not None  # restorable without S3


def test_a_replacement_prefetches_the_newest_commit_until_its_trainer_resumed(s3_setup: Any, tmp_path: Path) -> None:
    import time as clock

    from agent.checkpoint.restore import materialize
    from agent.spare import Prefetch, SpareCache
    from spotrelay.contracts.control import TrainerEvent, append_event

    pipeline, local, s3, _ = s3_setup
    assert _save(pipeline, local, 2, numel=1024).error is None
    control = tmp_path / "control"
    append_event(control, TrainerEvent(kind="resumed", step=0, time=1.0))  # an earlier run's: old news
    prefetch = Prefetch(lambda: SpareCache(tmp_path / "new", s3.uri), control, every_s=0.05).start()
    mirrored = LocalTier(tmp_path / "new")
    deadline = clock.time() + 300
    while 2 not in mirrored.steps() and clock.time() < deadline:  # bounded: catches a hang only
        clock.sleep(0.05)
    # the trainer's own restore of the same step keeps the verified copy it finds (no second download)
    assert materialize(2, mirrored, s3).step == 2 and mirrored.steps() == [2]
    append_event(control, TrainerEvent(kind="resumed", step=2, time=2.0))
    prefetch._thread.join(timeout=300)
    assert not prefetch._thread.is_alive()  # its trainer resumed: the prefetch is over
    assert not [p for p in (tmp_path / "new").iterdir() if p.name.startswith(".download")]


def test_two_downloaders_of_one_step_keep_one_verified_copy(s3_setup: Any, tmp_path: Path) -> None:
    from agent.checkpoint.restore import materialize

    pipeline, local, s3, _ = s3_setup
    assert _save(pipeline, local, 4, numel=1024).error is None
    tier = LocalTier(tmp_path / "node")
    results: list[int] = []
    threads = [threading.Thread(target=lambda: results.append(materialize(4, tier, s3).step)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert results == [4, 4] and tier.verified(4).step == 4
    assert [p.name for p in (tmp_path / "node").iterdir()] == ["step-00000004"]


def test_checkpoints_s3_will_not_give_now_are_not_a_fresh_start(s3_setup: Any, tmp_path: Path) -> None:
    """A replacement node whose downloads break off (or whose listing fails) used to find "no usable
    checkpoint" and train from step 0 beside them; now resume raises CheckpointUnavailableError (the
    attempt ends as an infrastructure failure and is retried), leaves nothing half-downloaded, and
    changes nothing in S3."""
    pipeline, local, s3, _ = s3_setup
    for step in (2, 4):
        assert _save(pipeline, local, step, numel=1024).error is None
    before = s3.list_keys("")
    fresh = tmp_path / "node-b"
    cut_off = S3Tier(s3.uri, client=lambda: Unreachable(s3.client, "download_file"))
    with pytest.raises(CheckpointUnavailableError) as err:
        choose(LocalTier(fresh), cut_off)
    text = str(err.value)
    assert text.startswith("no checkpoint could be read now, so the run does not start over from step 0")
    assert "step-00000004 unusable: s3: " in text and "step-00000002 unusable: s3: " in text
    assert "download failed" in text
    assert _tree(fresh) == []  # no staging folder or partial step left behind
    unlisted = S3Tier(s3.uri, client=lambda: Unreachable(s3.client, "get_paginator"))
    with pytest.raises(CheckpointUnavailableError, match="could not list the checkpoints"):
        choose(LocalTier(fresh), unlisted)
    assert s3.list_keys("") == before
    assert choose(LocalTier(fresh), s3).step == 4  # once S3 answers again: the newest
    assert choose(LocalTier(tmp_path / "empty"), None) is None  # no committed checkpoint: a fresh start


def test_every_checkpoint_corrupt_is_refused_naming_each(s3_setup: Any, tmp_path: Path) -> None:
    """Every committed step broken (a shard overwritten, a shard deleted): a refusal naming each step
    and what to do, never a fresh start that retention would then prune while keeping the bad ones."""
    pipeline, local, s3, _ = s3_setup
    for step in (2, 4):
        assert _save(pipeline, local, step, numel=1024).error is None
    s3.client.put_object(Bucket=s3.bucket, Key=s3.key("step-00000004/model.pt"), Body=b"torn")
    s3.client.delete_object(Bucket=s3.bucket, Key=s3.key("step-00000002/model.pt"))
    with pytest.raises(CorruptCheckpointError) as err:
        choose(LocalTier(tmp_path / "node-b"), s3)
    text = str(err.value)
    assert text.startswith("every checkpoint is unusable (2), so the run does not start over from step 0")
    assert "step-00000004 unusable: s3: " in text and "shard model.pt has 4 bytes" in text
    assert "step-00000002 unusable: s3: " in text and "a shard is missing" in text
    assert text.endswith("move them away to start from scratch")


def test_a_node_that_cannot_download_any_step_stops_every_rank(s3_setup: Any, tmp_path: Path) -> None:
    """Rank 0 holds both steps locally; the other node's downloads break off for each. Passing over
    step 4, then step 2, used to end at "no checkpoint": every rank trained from step 0. Now every
    rank raises CheckpointUnavailableError (the node's failure may pass), none waits in a collective."""
    pipeline, local, s3, _ = s3_setup
    for step in (2, 4):
        assert _save(pipeline, local, step, numel=1024).error is None
    cut_off = S3Tier(s3.uri, client=lambda: Unreachable(s3.client, "download_file"))
    group, raised = TwoRanks(), {}

    def rank(r: int, node: LocalTier, tier: S3Tier) -> None:
        try:
            agree_on_step(r == 0, r != 0, node, tier, None, lambda step: group.share(r, step),
                          lambda ok: group.every(r, ok))  # fmt: skip
        except CheckpointUnavailableError as exc:
            raised[r] = str(exc)

    other = threading.Thread(target=rank, args=(1, LocalTier(tmp_path / "node-b"), cut_off))
    other.start()
    rank(0, local, s3)
    other.join(300)
    assert set(raised) == {0, 1}
    assert raised[1].startswith("no checkpoint every node can use, so the run does not start over from step 0")
    assert "step-00000004 unusable: s3: " in raised[1] and "step-00000002 unusable: s3: " in raised[1]
    assert raised[0].endswith("another node could not use them")
