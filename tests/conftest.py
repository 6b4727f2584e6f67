"""Shared fixtures: one moto server per test session, reset between tests that ask for AWS."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
EVENTS = Path(__file__).resolve().parent / "events"

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(ROOT / ".cache" / "torch_extensions"))
os.environ.setdefault("POWERTOOLS_SERVICE_NAME", "spotrelay")
os.environ.setdefault("POWERTOOLS_TRACE_DISABLED", "true")
os.environ.setdefault("POWERTOOLS_METRICS_NAMESPACE", "spotrelay")
# the simulator's source, not its native build: tests patch its methods, which compiled classes ignore;
# tests/unit/test_sim_native.py runs the build beside the source (spotrelay/sim_native.py)
os.environ.setdefault("SPOTRELAY_SIM_NATIVE", "0")


@pytest.fixture(scope="session")
def moto_server() -> Iterator[object]:
    from spotrelay.local import motoserver

    server = motoserver.start(apply_env=True)
    yield server
    server.stop()


@pytest.fixture
def aws(moto_server: object) -> Iterator[dict[str, str]]:
    """A clean moto with the controller's tables, bucket and topic; yields their names."""
    from spotrelay.local import provision
    from spotrelay.settings import reset, settings

    moto_server.reset()  # type: ignore[attr-defined]
    for key in ("SPOTRELAY_TOPIC_ARN", "SPOTRELAY_STATE_MACHINE_ARN"):
        os.environ.pop(key, None)
    reset()
    created = provision.create_storage()
    os.environ["SPOTRELAY_TOPIC_ARN"] = created["topic_arn"]
    reset()
    s = settings()
    yield {"bucket": s.bucket, "jobs_table": s.jobs_table, "topic_arn": created["topic_arn"]}


@pytest.fixture(scope="session")
def _mlflow_schema(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One empty sqlite MLflow store with its schema migrated: a new store runs MLflow's ~50 schema
    migrations, 4-8 s here; each test gets a copy."""
    from mlflow.tracking import MlflowClient

    db = tmp_path_factory.mktemp("mlflow-schema") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{db}").search_experiments()
    return db


@pytest.fixture
def mlflow_uri(_mlflow_schema: Path, tmp_path: Path) -> str:
    """A fresh, empty MLflow store of this test's own (real MLflow on sqlite)."""
    import shutil

    db = tmp_path / "mlflow.db"
    shutil.copyfile(_mlflow_schema, db)
    return f"sqlite:///{db}"


def load_event(name: str) -> dict[str, Any]:
    """A real-format AWS event sample from tests/events/."""
    import json

    data: dict[str, Any] = json.loads((EVENTS / name).read_text())
    return data


class MaliciousPayload:
    """Unpickling this runs ``os.system`` (writes a marker file): the classic malicious checkpoint."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))
