"""Checkpoints this run cannot use are refused before anything loads, naming the folder, the
difference and what to do; nothing saved changes (a real torch session, one process, no dist)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

from agent.batching import plan_batch
from agent.checkpoint.compat import check_manifest, check_optimizer, check_parameters
from agent.checkpoint.manifest import Manifest
from agent.training import spotrelay_session
from spotrelay.contracts.control import read_events
from spotrelay.errors import BatchPlanError, IncompatibleCheckpointError


def _manifest(**fields: object) -> Manifest:
    base: dict[str, object] = {"step": 4, "engine": "dcp", "world_size": 2, "ranks": [0, 1], "shards": []}
    return Manifest.model_validate({**base, **fields})


def test_a_checkpoint_of_another_engine_is_refused_with_what_to_do() -> None:
    with pytest.raises(IncompatibleCheckpointError) as err:
        check_manifest(_manifest(), Path("/c/step-00000004"), "deepspeed", "", "", False)
    assert str(err.value).startswith("/c/step-00000004: written by a torch DDP/FSDP")
    assert "DeepSpeed session" in str(err.value) and "resume it with the engine that wrote it" in str(err.value)


def test_another_spec_is_refused_unless_allowed() -> None:
    manifest = _manifest(spec_hash="aaa")
    with pytest.raises(IncompatibleCheckpointError) as err:
        check_manifest(manifest, Path("/c/step-00000004"), "dcp", "bbb", "", False)
    assert str(err.value).startswith("/c/step-00000004: saved under spec aaa, this run's is bbb (its training "
                                     "definition: entrypoint, launcher, dataset); resume with the spec that wrote it")
    check_manifest(manifest, Path("/c/step-00000004"), "dcp", "bbb", "", True)  # logged, resumed
    check_manifest(manifest, Path("/c/step-00000004"), "dcp", "", "", False)  # no spec given: a local run


def test_only_another_training_definition_is_refused() -> None:
    """The manifest records the training hash: a resubmission that raised the budget or added a region
    (another spec hash, the same training hash) resumes; another learning rate is refused unless
    allowed. A checkpoint from before the training hash recorded the whole spec's: that one matches too."""
    manifest = _manifest(spec_hash="t1")
    check_manifest(manifest, Path("/c/step-00000004"), "dcp", "bbb", "", False, training_hash="t1")
    with pytest.raises(IncompatibleCheckpointError, match="saved under spec t1, this run's is t2"):
        check_manifest(manifest, Path("/c/step-00000004"), "dcp", "bbb", "", False, training_hash="t2")
    check_manifest(manifest, Path("/c/step-00000004"), "dcp", "bbb", "", True, training_hash="t2")
    legacy = _manifest(spec_hash="aaa")  # the whole spec's hash, written before 5 December
    check_manifest(legacy, Path("/c/step-00000004"), "dcp", "aaa", "", False, training_hash="t1")


def test_tensor_or_pipeline_parallel_layouts_cannot_change() -> None:
    with pytest.raises(IncompatibleCheckpointError, match="saved with tp=2; only the data-parallel size"):
        check_manifest(_manifest(layout={"dp": 2, "tp": 2, "pp": 1}), Path("/c"), "dcp", "", "", False)


def test_missing_extra_and_reshaped_parameters_are_named() -> None:
    saved = {"a.weight": (4, 4), "b.weight": (2,), "old.weight": (1,)}
    live = {"a.weight": (4, 8), "b.weight": (2,), "new.weight": (3,)}
    with pytest.raises(IncompatibleCheckpointError) as err:
        check_parameters(Path("/c/step-00000004"), saved, live)
    text = str(err.value)
    assert "the model has no old.weight" in text and "the checkpoint has no new.weight" in text
    assert "a.weight saved (4, 4), now (4, 8)" in text
    wider = {f"l{i}.weight": (8,) for i in range(5)}
    with pytest.raises(IncompatibleCheckpointError, match=r"l2.weight saved \(4,\), now \(8,\) and 2 more;"):
        check_parameters(Path("/c"), {k: (4,) for k in wider}, wider)


def _digest(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(folder)).encode() + path.read_bytes())
    return digest.hexdigest()


def _saved_two_steps(checkpoint_dir: Path, momentum: float = 0.0) -> torch.nn.Module:
    """A 4x4 model trained 2 steps with SGD (``momentum``) and checkpointed in ``checkpoint_dir``."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum)
    session = spotrelay_session(model, optimizer, checkpoint_dir=checkpoint_dir)
    for _ in session.steps(2):
        optimizer.zero_grad()
        model(torch.ones(1, 4)).sum().backward()
        optimizer.step()
    assert session.close() == 0
    return model


def test_a_different_model_is_refused_and_the_checkpoint_is_left_as_it_was(tmp_path: Path) -> None:
    _saved_two_steps(tmp_path)
    before = _digest(tmp_path)

    other = torch.nn.Sequential(torch.nn.Linear(4, 8))
    resumed = spotrelay_session(other, torch.optim.SGD(other.parameters(), lr=0.1), checkpoint_dir=tmp_path)
    with pytest.raises(IncompatibleCheckpointError) as err:
        resumed.resume()
    assert f"{tmp_path / 'step-00000002'}: another model" in str(err.value)
    assert "0.weight saved (4, 4), now (8, 4)" in str(err.value)
    resumed.close()
    assert _digest(tmp_path) == before


def test_a_refusal_is_recorded_for_the_agent_and_changes_nothing(tmp_path: Path) -> None:
    """The session appends a ``refused`` event with the message (the agent reports exit 80 from it)."""
    torch.manual_seed(0)
    ckpt, control_dir = tmp_path / "ckpt", tmp_path / "control"
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    session = spotrelay_session(model, optimizer, checkpoint_dir=ckpt, spec_hash="aaa", control_dir=control_dir)
    for _ in session.steps(1):
        optimizer.step()
    assert session.close() == 0
    before = _digest(ckpt)

    other = spotrelay_session(model, optimizer, checkpoint_dir=ckpt, spec_hash="bbb", control_dir=control_dir)
    with pytest.raises(IncompatibleCheckpointError) as err:
        list(other.steps(2))  # the loop resumes first
    other.close()
    events, _ = read_events(control_dir)
    [refused] = [e for e in events if e.kind == "refused"]
    assert refused.detail == str(err.value) and "saved under spec aaa" in refused.detail
    assert [e.kind for e in events if e.kind in ("resumed", "first_step")] == ["first_step"]  # the first run's only
    assert _digest(ckpt) == before


def test_a_resubmission_with_the_same_training_definition_resumes(tmp_path: Path) -> None:
    """The manifest records the training hash; a session under another spec hash but the same training
    definition (the budget raised, a region added) resumes from it, another definition is refused."""
    torch.manual_seed(0)
    ckpt, control_dir = tmp_path / "ckpt", tmp_path / "control"
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    first = spotrelay_session(model, optimizer, checkpoint_dir=ckpt, spec_hash="aaa", training_hash="t1",
                              control_dir=control_dir)
    for _ in first.steps(1):
        optimizer.step()
    assert first.close() == 0
    raised = spotrelay_session(model, optimizer, checkpoint_dir=ckpt, spec_hash="bbb", training_hash="t1",
                               control_dir=control_dir)
    assert raised.resume() == 1
    raised.close()
    other = spotrelay_session(model, optimizer, checkpoint_dir=ckpt, spec_hash="bbb", training_hash="t2",
                              control_dir=control_dir)
    with pytest.raises(IncompatibleCheckpointError, match="saved under spec t1, this run's is t2"):
        other.resume()
    other.close()


def test_a_world_that_cannot_split_the_recorded_global_batch_names_the_checkpoint(tmp_path: Path) -> None:
    ckpt, control_dir = tmp_path / "ckpt", tmp_path / "control"
    step_dir = ckpt / "step-00000003"
    step_dir.mkdir(parents=True)
    (step_dir / "manifest.json").write_text(_manifest(step=3, data_state={"global_batch": 12}).model_dump_json())
    with pytest.raises(BatchPlanError) as err:  # one rank (no process group) of micro-batch 5
        plan_batch(5, checkpoint_dir=ckpt, control_dir=control_dir)
    text = str(err.value)
    assert text.startswith(f"{step_dir}: trained with global batch 12, which a resume keeps")
    assert "cannot be split over 1 ranks of micro-batch 5" in text
    events, _ = read_events(control_dir)
    assert [(e.kind, e.detail) for e in events] == [("refused", text)]


def test_another_optimizer_is_refused_naming_its_state() -> None:
    saved = {"optim.state.0.weight.momentum_buffer", "optim.param_groups.0.lr", "optim.param_groups.0.momentum"}
    live = {"state": {"0.weight": {"exp_avg": 0, "exp_avg_sq": 0, "step": 0}},
            "param_groups": [{"lr": 0.1, "betas": (0.9, 0.99), "params": ["0.weight"]}]}  # fmt: skip
    with pytest.raises(IncompatibleCheckpointError) as err:
        check_optimizer(Path("/c/step-00000004"), saved, live)
    text = str(err.value)
    assert text.startswith("/c/step-00000004: another optimizer: the checkpoint has no optimizer state exp_avg")
    assert "this optimizer keeps no momentum_buffer (saved)" in text and "param groups have no betas, params" in text
    same = {"state": {"0.weight": {"momentum_buffer": 0}}, "param_groups": [{"lr": 0.1, "momentum": 0.9}]}
    check_optimizer(Path("/c"), saved, same)


def test_a_session_with_another_optimizer_is_refused_before_loading(tmp_path: Path) -> None:
    model = _saved_two_steps(tmp_path, momentum=0.9)
    before = _digest(tmp_path)
    other = torch.optim.AdamW(model.parameters(), lr=0.1)
    resumed = spotrelay_session(model, other, checkpoint_dir=tmp_path)
    # it used to fail inside DCP (a CorruptCheckpointError naming no cause)
    with pytest.raises(IncompatibleCheckpointError, match="another optimizer: the saved param groups have no "
                                                          "amsgrad, betas"):
        resumed.resume()
    resumed.close()
    assert _digest(tmp_path) == before
