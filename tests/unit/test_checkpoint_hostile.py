"""Resume inputs that are not what we wrote: a manifest of a newer format, hostile manifests and
trainer files. Each is an error naming the file and the field; nothing runs code from them.

A newer format is refused on every rank and never skipped for an older checkpoint (that would
resume older work, silently); a corrupt manifest is skipped for the previous step as before.
"""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from agent.batching import plan_batch
from agent.checkpoint import arena_files
from agent.checkpoint.local_tier import LocalTier
from agent.checkpoint.manifest import MANIFEST, sha256_file, step_name
from agent.checkpoint.restore import agree_on_step, choose
from agent.checkpoint.state import load_trainer_state, save_trainer_state, trainer_file
from agent.training import spotrelay_session
from spotrelay.contracts.control import read_events
from spotrelay.errors import (
    CheckpointFormatError,
    CheckpointUnavailableError,
    CorruptCheckpointError,
    UnsafeCheckpointError,
)
from tests.conftest import MaliciousPayload


def _train(ckpt: Path, steps: int = 2, **config: Any) -> None:
    """A real session: a 2x1 model saved at every step."""
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    session = spotrelay_session(model, optimizer, checkpoint_dir=ckpt, every_steps=1, keep_local=5, **config)
    for _ in session.steps(steps):
        model(torch.ones(1, 2)).sum().backward()
        optimizer.step()
    assert session.close() == 0


def _edit_manifest(ckpt: Path, at: int, **fields: Any) -> Path:
    path = ckpt / step_name(at) / MANIFEST
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))
    return path


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def two_steps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ckpt = tmp_path_factory.mktemp("saved") / "ckpt"
    _train(ckpt)
    return ckpt


@pytest.fixture
def ckpt(two_steps: Path, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(two_steps, tmp_path / "ckpt"))


def test_a_newer_manifest_format_is_refused_and_never_skipped_for_an_older_step(ckpt: Path) -> None:
    path = _edit_manifest(ckpt, 2, format=3, something_new={"x": 1})
    control = ckpt.parent / "control"
    before = _files(ckpt)
    with pytest.raises(CheckpointFormatError) as err:
        choose(LocalTier(ckpt), None)
    text = str(err.value)
    assert text.startswith(f"{path}: manifest format 3, newer than this spotrelay reads (formats 1, 2)")
    assert "upgrade spotrelay" in text
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    session = spotrelay_session(model, torch.optim.SGD(model.parameters(), lr=0.1), checkpoint_dir=ckpt,
                                control_dir=control)  # fmt: skip
    with pytest.raises(CheckpointFormatError):
        list(session.steps(3))  # resumes first: refused, step 1 is not used instead
    assert session.step == 0 and session.resumed_from is None
    session.close()
    assert [(e.kind, e.detail) for e in read_events(control)[0]] == [("refused", text)]
    with pytest.raises(CheckpointFormatError):  # the batch plan reads the newest manifest too
        plan_batch(1, checkpoint_dir=ckpt)
    assert _files(ckpt) == before


def test_a_corrupt_manifest_still_falls_back_naming_the_field(ckpt: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = _edit_manifest(ckpt, 2, world_size="two")
    chosen = choose(LocalTier(ckpt), None)
    assert chosen is not None and chosen.step == 1
    assert f"{path}: unreadable manifest: field world_size: Input should be a valid integer" in caplog.text


def test_every_rank_refuses_a_newer_format_another_node_read(tmp_path: Path) -> None:
    """Rank 0 proposed step 4 from its own copy; this node's copy has a format-3 manifest."""
    tier = LocalTier(tmp_path)
    tier.step_dir(4).mkdir(parents=True)
    (tier.step_dir(4) / MANIFEST).write_text(json.dumps({"format": 3, "step": 4}))
    flags: list[bool] = []

    def every(ok: bool) -> bool:  # this rank's view of the all-reduce (the other ranks said yes)
        flags.append(ok)
        return ok

    with pytest.raises(CheckpointFormatError, match="manifest format 3"):
        agree_on_step(False, True, tier, None, None, lambda _: 4, every)
    assert flags == [False, False]  # not usable, and a newer format: the second all-reduce, never a fallback
    with pytest.raises(CheckpointFormatError, match="format 9"):  # the proposer's error, handed to every rank
        agree_on_step(False, False, tier, None, None, lambda _: ("format", "x: manifest format 9"), every)
    with pytest.raises(CorruptCheckpointError, match="every checkpoint is unusable"):  # so is its refusal
        agree_on_step(False, False, tier, None, None, lambda _: ("corrupt", "every checkpoint is unusable"), every)
    with pytest.raises(CheckpointUnavailableError, match="could not be read now"):  # and a failure that may pass
        agree_on_step(False, False, tier, None, None, lambda _: ("unavailable", "could not be read now"), every)
    with pytest.raises(CheckpointFormatError, match="manifest format 3"):  # the proposer itself
        agree_on_step(True, False, tier, None, None, lambda proposal: proposal, every)


HOSTILE: dict[str, tuple[dict[str, Any], str]] = {
    "wrong type": ({"world_size": "two"}, "field world_size: Input should be a valid integer"),
    "negative samples": ({"samples": -5}, "field samples: Input should be greater than or equal to 0"),
    "negative step": ({"step": -1}, "field step: Input should be greater than or equal to 0"),
    "huge world": ({"world_size": 10**12}, "field world_size: Input should be less than or equal to"),
    "huge step": ({"step": 10**30}, "field step: Input should be less than or equal to"),
    "step of another folder": ({"step": 1}, "field step is 1, the folder is step-00000002"),
    "format null": ({"format": None}, "field format: Input should be a valid integer"),
    "escaping shard": ({"shards": [{"path": "../../x", "size": 1, "sha256": "0" * 64, "rank": 0}]},
                       "field shards.0.path: '../../x' is not a relative path inside the step folder"),
    "absolute shard": ({"shards": [{"path": "/etc/passwd", "size": 1, "sha256": "0" * 64, "rank": 0}]},
                       "field shards.0.path: '/etc/passwd' is not a relative path"),
    "bad checksum": ({"shards": [{"path": "a", "size": 1, "sha256": "x", "rank": 0}]}, "field shards.0.sha256"),
    "batch not a number": ({"data_state": {"global_batch": "abc"}},
                           "field data_state: global_batch is 'abc', not an integer >= 1"),
    "negative cursor": ({"data_state": {"cursor": -3}}, "cursor is -3, not an integer >= 0"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_manifest_names_the_file_and_field(ckpt: Path, case: str) -> None:
    fields, expected = HOSTILE[case]
    path = _edit_manifest(ckpt, 2, **fields)
    with pytest.raises(CorruptCheckpointError) as err:
        LocalTier(ckpt).manifest(2)
    assert str(err.value).startswith(f"{path}: ") and expected in str(err.value)
    chosen = choose(LocalTier(ckpt), None)  # and the resume passes over it
    assert chosen is not None and chosen.step == 1


def test_a_manifest_that_is_not_json_or_too_large_is_corrupt(ckpt: Path) -> None:
    path = ckpt / step_name(2) / MANIFEST
    path.write_bytes(b"[" * 100_000)
    with pytest.raises(CorruptCheckpointError, match="unreadable manifest"):
        LocalTier(ckpt).manifest(2)
    path.write_bytes(b" " * (65 << 20))
    with pytest.raises(CorruptCheckpointError, match="more than 67108864 bytes"):
        LocalTier(ckpt).manifest(2)


def _rehash(ckpt: Path, step: int, rel: str) -> Path:
    """Record a rewritten shard's size and sha256 in the manifest (a hostile writer can do both), so
    only the loader's own checks stand in the way."""
    path = ckpt / step_name(step) / rel
    manifest_path = ckpt / step_name(step) / MANIFEST
    manifest = json.loads(manifest_path.read_text())
    size, digest = sha256_file(path)
    for shard in manifest["shards"]:
        if shard["path"] == rel:
            shard.update(size=size, sha256=digest)
    manifest_path.write_text(json.dumps(manifest))
    return path


def _rewrite_trainer_file(ckpt: Path, step: int, state: Any) -> Path:
    path = trainer_file(ckpt / step_name(step), 0)
    torch.save(state, path) if not isinstance(state, dict) else save_trainer_state(path, state)
    return _rehash(ckpt, step, "trainer/rank-0.pt")


def _resume(ckpt: Path) -> Any:
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    session = spotrelay_session(model, torch.optim.SGD(model.parameters(), lr=0.1), checkpoint_dir=ckpt,
                                control_dir=ckpt.parent / "control")  # fmt: skip
    try:
        return session.resume()
    finally:
        session.close()


def test_a_pickle_in_the_trainer_file_is_refused_and_runs_nothing(ckpt: Path) -> None:
    marker = ckpt.parent / "pwned"
    path = _rewrite_trainer_file(ckpt, 2, [MaliciousPayload(marker)])
    with pytest.raises(UnsafeCheckpointError, match=f"{path}: refused to load"):
        _resume(ckpt)
    assert not marker.exists()
    [refused] = [e for e in read_events(ckpt.parent / "control")[0] if e.kind == "refused"]
    assert str(path) in (refused.detail or "")


TRAINER = {
    "step": ("step", "abc", "trainer state field step is 'abc', expected an integer >= 0"),
    "cursor": ("cursor", -1, "trainer state field cursor is -1, expected an integer >= 0"),
    "rng": ("rng", {"python": 1}, "trainer state field rng.python is 1, expected python's random.getstate()"),
    "requests": ("handled_requests", "r-1", "field handled_requests is 'r-1', expected a list of request ids"),
    "extra": ("extra", None, "trainer state field extra is None, expected a dict"),
}


@pytest.mark.parametrize("case", list(TRAINER))
def test_a_bad_trainer_field_is_named_before_anything_is_applied(ckpt: Path, case: str) -> None:
    key, value, expected = TRAINER[case]
    state = load_trainer_state(trainer_file(ckpt / step_name(2), 0))
    path = _rewrite_trainer_file(ckpt, 2, {**state, key: value})
    with pytest.raises(CorruptCheckpointError) as err:
        _resume(ckpt)
    assert str(err.value) == f"{path}: {expected}" or (str(err.value).startswith(f"{path}: ")
                                                       and expected in str(err.value))  # fmt: skip


class _Objects:
    """The ObjectStore port over a dict (describe reads only list_keys and get)."""

    def __init__(self, objects: dict[str, bytes]) -> None:
        self.objects = objects

    def list_keys(self, prefix: str) -> list[str]:
        return [k for k in self.objects if k.startswith(prefix)]

    def get(self, key: str, max_bytes: int | None = None) -> bytes:
        return self.objects[key][:max_bytes]


def test_describe_lists_a_newer_format_and_skips_a_hostile_manifest(caplog: pytest.LogCaptureFixture) -> None:
    """The controller's only manifest reader is `spotrelay describe`'s listing: a newer format is a
    committed checkpoint all the same; a hostile one is skipped with its key logged, no traceback."""
    from spotrelay.services.describe import checkpoints

    def key(step: int) -> str:
        return f"checkpoints/j/step-{step:08d}/manifest.json"

    found = checkpoints(_Objects({  # type: ignore[arg-type]
        key(1): json.dumps({"format": 2, "step": 1, "shards": [{"size": 5}]}).encode(),
        key(2): json.dumps({"format": 3, "step": 2, "shards": [{"size": 7}], "new": True}).encode(),
        key(3): json.dumps({"step": "abc", "shards": [1, 2]}).encode(),
        key(4): json.dumps([1, 2]).encode(),
    }), "checkpoints/j/")  # fmt: skip
    assert [(c.step, c.bytes) for c in found] == [(1, 5), (2, 7)]
    assert f"unreadable manifest {key(3)}" in caplog.text and f"unreadable manifest {key(4)}" in caplog.text


def test_dcp_metadata_of_another_shape_is_corrupt_naming_the_file(ckpt: Path) -> None:
    """Only allow-listed classes unpickle from ``.metadata``; a plain dict there used to end in an
    AttributeError traceback inside DCP."""
    (ckpt / step_name(2) / "model" / ".metadata").write_bytes(pickle.dumps({"state_dict_metadata": {}}))
    path = _rehash(ckpt, 2, "model/.metadata")
    with pytest.raises(CorruptCheckpointError, match=f"{path}: holds a dict, not DCP metadata"):
        _resume(ckpt)


SKELETONS = {
    "negative offset": ({"offset": -1, "nbytes": 8, "dtype": "float32", "shape": [2]}, "field tensors.0 (offset"),
    "bytes and shape disagree": ({"offset": 0, "nbytes": 8, "dtype": "float32", "shape": [3]},
                                 "field tensors.0: 8 bytes do not make shape [3]"),
    "unknown dtype": ({"offset": 0, "nbytes": 8, "dtype": "os.system", "shape": [2]}, "unknown dtype 'os.system'"),
    "reference out of range": ({"offset": 0, "nbytes": 8, "dtype": "float32", "shape": [2]},
                               "a tensor reference 5 outside its 1"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(SKELETONS))
def test_a_skeleton_whose_tensor_records_do_not_fit_is_corrupt(tmp_path: Path, case: str) -> None:
    """DeepSpeed's files are skeletons (weights_only) plus raw bytes; a record that does not fit the
    raw file used to end in a ValueError or IndexError from torch."""
    spec, expected = SKELETONS[case]
    path = tmp_path / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    ref = 5 if case == "reference out of range" else 0
    torch.save({"format": arena_files.FORMAT, "tree": {"w": {arena_files.MARK: ref}}, "tensors": [spec]}, path)
    arena_files.sidecar(path).write_bytes(b"\0" * 8)
    with pytest.raises(CorruptCheckpointError, match=re.escape(f"{path}: {expected}")):
        arena_files.load(path, lazy=case == "bytes and shape disagree")


@pytest.mark.parametrize(("value", "shown"), [("0.1", "'0.1'"), (float("nan"), "nan"), ([0.1], r"\[0.1\]")])
def test_a_hyper_parameter_of_another_kind_is_corrupt_before_any_step(tmp_path: Path, value: Any, shown: str) -> None:
    """A param group's values pass the pickle scan and torch copies them as they are: a string
    learning rate used to end in a TypeError traceback at the first step, on every retry."""
    ckpt = tmp_path / "ckpt"
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    session = spotrelay_session(model, optimizer, checkpoint_dir=ckpt, every_steps=1, keep_local=5)
    for index, _ in session.steps(2):
        model(torch.ones(1, 2)).sum().backward()
        optimizer.step()
        if index == 1:  # written into the step-2 checkpoint as it is
            optimizer.param_groups[0]["lr"] = value
    assert session.close() == 0
    expected = rf"{re.escape(str(ckpt / step_name(2) / 'model'))}: optimizer field param_groups.0.lr is {shown}"
    with pytest.raises(CorruptCheckpointError, match=expected):
        _resume(ckpt)
    [refused] = [e for e in read_events(ckpt.parent / "control")[0] if e.kind == "refused"]
    assert "optimizer field param_groups.0.lr" in (refused.detail or "")  # the agent reports it, never retries


def test_the_hyper_parameters_this_run_saved_resume() -> None:
    """The check accepts what torch's own optimizers write (flags, None, tuples, tensors)."""
    from agent.checkpoint.group_check import check_param_groups

    model = torch.nn.Linear(2, 1)
    for optimizer in (torch.optim.AdamW(model.parameters(), lr=torch.tensor(0.01)),
                      torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True)):  # fmt: skip
        saved = optimizer.state_dict()["param_groups"]
        check_param_groups(Path("ckpt"), saved, optimizer.param_groups)
        with pytest.raises(CorruptCheckpointError, match="ckpt: optimizer field param_groups holds 2 groups"):
            check_param_groups(Path("ckpt"), saved * 2, optimizer.param_groups)
