"""Session settings, read from the SPOTRELAY_* environment the agent sets for the trainer."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from spotrelay.contracts import control as c
from spotrelay.contracts.cadence import AUTO, MinutesOrAuto
from spotrelay.contracts.health import ENV_HEALTH, HealthPolicy
from spotrelay.spec.models import Checkpoint

_SPEC = Checkpoint.model_fields  # the auto bounds' defaults are the spec's


def _float(name: str, expected: str = "a number") -> float | None:
    value = os.environ.get(name)
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{name}={value!r}: expected {expected}") from None


def _int(name: str, default: int | None) -> int | None:
    value = os.environ.get(name)
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r}: expected a whole number") from None


def _minutes(name: str) -> float | str | None:
    """A number of minutes, or ``auto`` (the cadence from the market)."""
    return AUTO if os.environ.get(name, "").strip().lower() == AUTO else _float(name, f"minutes or {AUTO!r}")


def _bool(name: str) -> bool | None:
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return None
    if value in ("0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    raise ValueError(f"{name}={value!r}: expected 0/1, true/false, yes/no or on/off")


def code_hash(path: str | None = None) -> str:
    """sha256 of the training script (the entry point), so a resumed run can tell code changed."""
    target = Path(path or sys.argv[0])
    try:
        return hashlib.sha256(target.read_bytes()).hexdigest()[:16]
    except OSError:
        return ""


class SessionConfig(BaseModel, MinutesOrAuto):
    model_config = ConfigDict(extra="forbid")
    checkpoint_dir: Path = Path("checkpoints")
    checkpoint_uri: str | None = None  # s3://bucket/checkpoints/<job>; None: local tier only
    control_dir: Path | None = None
    job_id: str = "local"
    spec_hash: str = ""
    training_hash: str = ""  # the spec's training definition: what a resume is checked against
    code_hash: str = ""
    every_steps: int | None = Field(None, ge=1)
    every_minutes: Annotated[float, Field(gt=0)] | Literal["auto"] | None = None
    # with "auto" (agent/cadence.py): the controller's mean seconds between the gang's losses without
    # a notice (None: none expected, the interval is the ceiling) and the bounds on the interval
    loss_interval_s: float | None = Field(None, gt=0)
    auto_min_minutes: float = Field(_SPEC["auto_min_minutes"].default, gt=0)
    auto_max_minutes: float = Field(_SPEC["auto_max_minutes"].default, gt=0)
    keep_local: int = Field(2, ge=1)
    keep_s3: int = Field(5, ge=1)
    save_final: bool = True
    allow_spec_change: bool = False  # a checkpoint saved under another spec hash is refused unless set
    allow_global_batch_change: bool = False  # a global batch other than the checkpoint's is refused unless set
    commit_timeout_s: float = 900.0
    # Periodic uploads are background traffic: few connections (and optionally a bandwidth cap)
    # leave the cores, memory bandwidth and NIC to training. Emergency uploads use every connection.
    background_upload_workers: int = Field(2, ge=1)
    background_upload_mb_s: float | None = Field(None, gt=0)
    upload_workers: int = Field(8, ge=1)
    health: HealthPolicy = Field(default_factory=HealthPolicy)  # the spec's health section (SPOTRELAY_HEALTH)
    # A spot notice: snapshot at once, keep training, final save as late as the flush time allows.
    notice_training: bool = True
    notice_margin_s: float = Field(3.0, ge=0)  # plus notice_margin_share of the predicted flush
    notice_margin_share: float = Field(0.25, ge=0)
    flush_prior_mb_s: float = Field(100.0, gt=0)  # before this rank has timed a save of its own

    @model_validator(mode="after")
    def _bounds(self) -> SessionConfig:
        self.check_auto_bounds()
        return self

    @classmethod
    def from_env(cls, **defaults: Any) -> SessionConfig:
        """``defaults`` from the script (None ignored); the agent's environment wins where set."""
        values: dict[str, Any] = {"code_hash": code_hash()}
        values.update({k: v for k, v in defaults.items() if v is not None})
        env: dict[str, Any] = {
            "checkpoint_dir": os.environ.get(c.ENV_CHECKPOINT_DIR) or None,
            "checkpoint_uri": os.environ.get(c.ENV_CHECKPOINT_URI) or None,
            "control_dir": os.environ.get(c.ENV_CONTROL_DIR) or None,
            "job_id": os.environ.get(c.ENV_JOB_ID) or None,
            "spec_hash": os.environ.get(c.ENV_SPEC_HASH) or None,
            "training_hash": os.environ.get(c.ENV_TRAINING_HASH) or None,
            "every_steps": _int(c.ENV_CHECKPOINT_EVERY_STEPS, None),
            "every_minutes": _minutes(c.ENV_CHECKPOINT_EVERY_MINUTES),
            "loss_interval_s": _float(c.ENV_CHECKPOINT_LOSS_INTERVAL_S),
            "auto_min_minutes": _float(c.ENV_CHECKPOINT_AUTO_MIN_MINUTES),
            "auto_max_minutes": _float(c.ENV_CHECKPOINT_AUTO_MAX_MINUTES),
            "keep_local": _int(c.ENV_KEEP_LOCAL, None),
            "keep_s3": _int(c.ENV_KEEP_S3, None),
            "notice_training": _bool(c.ENV_NOTICE_TRAINING),
            "notice_margin_s": _float(c.ENV_NOTICE_MARGIN_S),
            "allow_spec_change": True if os.environ.get(c.ENV_ALLOW_SPEC_CHANGE) == "1" else None,
            "allow_global_batch_change": True if os.environ.get(c.ENV_ALLOW_GLOBAL_BATCH_CHANGE) == "1" else None,
        }
        values.update({k: v for k, v in env.items() if v is not None})
        if os.environ.get(ENV_HEALTH):
            values["health"] = HealthPolicy.from_env()
        return cls(**values)
