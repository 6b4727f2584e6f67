"""The control channel between the node agent and the training processes on that node.

Files in one directory per node (``SPOTRELAY_CONTROL_DIR``), written atomically (temp + rename):

- ``request.json``  agent -> trainer. A :class:`StopRequest`. Every rank polls it at each step
  boundary (one ``stat``), then the ranks agree with one all-reduce(MAX) so that all of them act at
  the same step, even when only one node's agent was told.
- ``events.jsonl``  trainer -> agent. One :class:`TrainerEvent` per line, appended by local rank 0 of
  each node after the global commit (so every node's agent can report it).
- ``progress.json`` trainer -> agent. The last finished step, for heartbeats.

A file, rather than a signal, survives the launcher (torchrun forwards few signals), needs no
handler in user code, and carries a deadline and a reason.
"""

from __future__ import annotations

import json
import os
import tempfile
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from spotrelay.contracts.health import HealthAnomaly

REQUEST_FILE = "request.json"
EVENTS_FILE = "events.jsonl"
PROGRESS_FILE = "progress.json"
METRICS_FILE = "metrics.jsonl"  # rank 0: one JSON object per step (step, loss, lr, grad_norm, ...)

# Environment the agent sets for the training command.
ENV_CONTROL_DIR = "SPOTRELAY_CONTROL_DIR"
ENV_JOB_ID = "SPOTRELAY_JOB_ID"
ENV_ATTEMPT = "SPOTRELAY_ATTEMPT"
ENV_CHECKPOINT_DIR = "SPOTRELAY_CHECKPOINT_DIR"  # local fast tier
ENV_CHECKPOINT_URI = "SPOTRELAY_CHECKPOINT_URI"  # durable tier, s3://bucket/checkpoints/<job>
ENV_SPEC_HASH = "SPOTRELAY_SPEC_HASH"
# the spec's training definition (spotrelay.spec.training_hash): what a resume is checked against
ENV_TRAINING_HASH = "SPOTRELAY_TRAINING_HASH"
ENV_CHECKPOINT_EVERY_STEPS = "SPOTRELAY_CHECKPOINT_EVERY_STEPS"
ENV_CHECKPOINT_EVERY_MINUTES = "SPOTRELAY_CHECKPOINT_EVERY_MINUTES"  # a number, or "auto" (domain/cadence.py)
# with "auto": the controller's mean seconds between the gang's losses without a notice (unset: none
# expected) and the spec's bounds on the interval
ENV_CHECKPOINT_LOSS_INTERVAL_S = "SPOTRELAY_CHECKPOINT_LOSS_INTERVAL_S"
ENV_CHECKPOINT_AUTO_MIN_MINUTES = "SPOTRELAY_CHECKPOINT_AUTO_MIN_MINUTES"
ENV_CHECKPOINT_AUTO_MAX_MINUTES = "SPOTRELAY_CHECKPOINT_AUTO_MAX_MINUTES"
ENV_KEEP_LOCAL = "SPOTRELAY_KEEP_LOCAL"
ENV_KEEP_S3 = "SPOTRELAY_KEEP_S3"
ENV_ALLOW_SPEC_CHANGE = "SPOTRELAY_ALLOW_SPEC_CHANGE"  # "1": resume a checkpoint saved under another spec
# "1": resume with a global batch other than the checkpoint's (a new run definition, logged)
ENV_ALLOW_GLOBAL_BATCH_CHANGE = "SPOTRELAY_ALLOW_GLOBAL_BATCH_CHANGE"
ENV_MLFLOW_RUN_ID = "SPOTRELAY_MLFLOW_RUN_ID"
# the spec's launcher.deepspeed_config: a JSON file the agent wrote (inline config), or the spec's path
# (relative to working_dir, where the ranks run); spotrelay.training.deepspeed_config() reads it
ENV_DEEPSPEED_CONFIG = "SPOTRELAY_DEEPSPEED_CONFIG"
DEEPSPEED_CONFIG_FILE = "deepspeed_config.json"  # (in the control dir)
# Training through a spot notice (agent/notice_window.py): "0" stops at the notice instead; the
# safety margin kept before the deadline on top of the predicted flush time.
ENV_NOTICE_TRAINING = "SPOTRELAY_NOTICE_TRAINING"
ENV_NOTICE_MARGIN_S = "SPOTRELAY_NOTICE_MARGIN_S"


class RequestKind(StrEnum):
    CHECKPOINT_AND_STOP = "checkpoint_and_stop"  # preemption: save this step, exit PREEMPTED_SAVED
    CHECKPOINT = "checkpoint"  # proactive save (rebalance), keep training
    STOP = "stop"  # cancel: exit CANCELLED without saving


# Order matters: the all-reduce takes the MAX, so the strongest request wins.
REQUEST_CODE = {None: 0, RequestKind.CHECKPOINT: 1, RequestKind.CHECKPOINT_AND_STOP: 2, RequestKind.STOP: 3}


class StopRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    request_id: str
    kind: RequestKind
    deadline: float | None = None  # epoch seconds
    reason: str = ""


class TrainerEvent(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # "checkpoint_committed" | "notice_training" | "stopping" | "resumed" | "first_step" (the first
    # step this run finished: training is back, at ``world_size`` ranks) | "anomaly" | "refused"
    # (the run refused to start: ``detail`` says why; the agent reports exit REFUSED) | "unavailable"
    # (committed checkpoints could not be read now: ``detail`` says which; the agent reports INFRA_ERROR)
    kind: str
    step: int
    uri: str = ""
    duration_s: float = 0.0
    emergency: bool = False
    deadline: float | None = None
    request_id: str | None = None
    time: float = 0.0
    anomaly: HealthAnomaly | None = None  # kind "anomaly"
    stall_s: float | None = None  # checkpoint_committed: what the training loop waited for the snapshot
    attempt: int | None = None  # the attempt the trainer runs in (SPOTRELAY_ATTEMPT), stamped on every event
    world_size: int | None = None  # ranks in this run, stamped on every event
    # checkpoint_committed, from the rank that committed the durable manifest: the whole checkpoint's
    # bytes, every rank's shards (the controller weighs sending it between regions: placement.md)
    total_bytes: int | None = Field(None, ge=0)
    detail: str = ""  # kinds "refused", "unavailable": the error (the checkpoint, what differs, what to do)


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def write_request(control_dir: Path, request: StopRequest) -> None:
    write_atomic(control_dir / REQUEST_FILE, request.model_dump_json())


def read_request(control_dir: Path) -> StopRequest | None:
    try:
        return StopRequest.model_validate_json((control_dir / REQUEST_FILE).read_text())
    except (FileNotFoundError, ValueError):
        return None


def clear_request(control_dir: Path) -> None:
    (control_dir / REQUEST_FILE).unlink(missing_ok=True)


def append_event(control_dir: Path, event: TrainerEvent) -> None:
    control_dir.mkdir(parents=True, exist_ok=True)
    with open(control_dir / EVENTS_FILE, "a") as fh:
        fh.write(event.model_dump_json() + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def read_events(control_dir: Path, offset: int = 0) -> tuple[list[TrainerEvent], int]:
    """Events appended since byte ``offset``; returns them and the new offset."""
    path = control_dir / EVENTS_FILE
    try:
        with open(path) as fh:
            fh.seek(offset)
            data = fh.read()
    except FileNotFoundError:
        return [], offset
    complete = data[: data.rfind("\n") + 1]  # ignore a line still being written
    events = [TrainerEvent.model_validate_json(line) for line in complete.splitlines() if line.strip()]
    return events, offset + len(complete.encode())


def read_metrics(control_dir: Path, offset: int = 0) -> tuple[list[dict[str, float]], int]:
    """Per-step metric lines appended since byte ``offset`` (rank 0 writes them, unsynced)."""
    try:
        with open(control_dir / METRICS_FILE, "rb") as fh:
            fh.seek(offset)
            data = fh.read()
    except FileNotFoundError:
        return [], offset
    complete = data[: data.rfind(b"\n") + 1]
    rows = []
    for line in complete.splitlines():
        try:
            rows.append({k: float(v) for k, v in json.loads(line).items() if v is not None})
        except (ValueError, TypeError, AttributeError):
            continue  # a torn or foreign line: metrics are best effort
    return rows, offset + len(complete)


def write_progress(control_dir: Path, step: int) -> None:
    write_atomic(control_dir / PROGRESS_FILE, json.dumps({"step": step}))


def read_progress(control_dir: Path) -> int | None:
    try:
        return int(json.loads((control_dir / PROGRESS_FILE).read_text())["step"])
    except (FileNotFoundError, ValueError, KeyError):
        return None
