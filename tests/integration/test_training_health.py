"""Health checks in real training: 2 gloo ranks under torchrun, the tiny transformer of examples/tiny.

A NaN injected into step K's loss is found at that step's boundary by every rank, the session
rolls back to the newest checkpoint before it and skips the data window in between; the run then
ends with the same parameters and optimizer state as one that never saw the NaN and skipped the
same window. With ``stop``, the run exits UNHEALTHY without saving the poisoned step.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from spotrelay.contracts import control
from spotrelay.contracts.exit_codes import ExitCode
from spotrelay.contracts.health import ENV_HEALTH, AnomalyKind, HealthAction, HealthPolicy
from tests.conftest import ROOT
from tests.integration.torchrun import result, torchrun

pytestmark = pytest.mark.slow
TRAIN = ROOT / "examples" / "tiny" / "train.py"
STEPS, EVERY, NAN_AT = 10, 4, 6  # NaN in step index 6 -> found at boundary 7 -> back to step-4, skip 3


def _run(tmp: Path, name: str, *args: str, policy: HealthPolicy | None = None) -> None:
    env = {ENV_HEALTH: (policy or HealthPolicy()).model_dump_json()}
    torchrun(TRAIN, tmp, name, tmp / f"ckpt-{name}", ["--engine", "ddp", "--steps", str(STEPS), *args], env=env)


def test_nan_is_rolled_back_and_the_run_equals_one_that_skipped_the_window(tmp_path: Path) -> None:
    _run(tmp_path, "faulty", "--every", str(EVERY), "--inject-nan-at", str(NAN_AT))
    _run(tmp_path, "reference", "--skip-data", f"{EVERY}:{NAN_AT + 1 - EVERY}")
    for rank in (0, 1):
        faulty, reference = result(tmp_path, "faulty", rank), result(tmp_path, "reference", rank)
        assert faulty["exit"] == ExitCode.DONE
        assert faulty["state_sha256"] == reference["state_sha256"]
        replayed = [s for s, _ in faulty["losses"]]
        assert replayed == [*range(NAN_AT + 1), *range(EVERY, STEPS)]
    events, _ = control.read_events(tmp_path / "control")
    found = [e.anomaly for e in events if e.kind == "anomaly"]
    assert len(found) == 1 and found[0] is not None
    assert found[0].kind is AnomalyKind.NON_FINITE and found[0].action is HealthAction.ROLLBACK
    assert (found[0].step, found[0].rollback_to, found[0].skipped_batches) == (NAN_AT + 1, EVERY, NAN_AT + 1 - EVERY)
    # the poisoned boundary (step 7) was never saved; step-8 is the first save after the rollback
    saved = sorted(p.name for p in (tmp_path / "ckpt-faulty").glob("step-*"))
    assert "step-00000007" not in saved and "step-00000008" in saved


def test_stop_policy_ends_the_run_unhealthy_without_saving_the_bad_step(tmp_path: Path) -> None:
    policy = HealthPolicy(actions={AnomalyKind.NON_FINITE: HealthAction.STOP})
    _run(tmp_path, "stopped", "--every", "2", "--inject-nan-at", "2", policy=policy)
    for rank in (0, 1):
        assert result(tmp_path, "stopped", rank)["exit"] == ExitCode.UNHEALTHY
    assert not (tmp_path / "ckpt-stopped" / "step-00000003").exists()
    events, _ = control.read_events(tmp_path / "control")
    assert [(e.anomaly.kind, e.anomaly.action) for e in events if e.anomaly] == [
        (AnomalyKind.NON_FINITE, HealthAction.STOP)
    ]
    metrics, _ = control.read_metrics(tmp_path / "control")
    assert [m["step"] for m in metrics] == [1, 2, 3] and "loss" not in metrics[-1] and metrics[0]["lr"] > 0
