"""The session's health glue: what a step reports, the health monitor, the per-step metrics file.

The session asks :meth:`SessionHealth.extra` for the integers to add to its boundary all-reduce
and :meth:`SessionHealth.judge` for the agreed finding; what to do about a finding (rollback,
stop, report) is the session's (agent/training.py). Rank 0 also appends one line per step to
``metrics.jsonl`` in the control directory (loss, learning rate, grad norm, samples/s, step time),
which the agent forwards to MLflow: the training loop never waits for the tracking server.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import IO, Any

from agent.hang import register_stack_dump
from agent.health import HealthMonitor
from spotrelay.contracts.control import METRICS_FILE
from spotrelay.contracts.health import HealthAction, HealthAnomaly, HealthPolicy

log = logging.getLogger("spotrelay.training")


def _float(value: Any) -> float | None:
    if value is None:
        return None
    try:
        return float(value.detach()) if hasattr(value, "detach") else float(value)
    except (TypeError, ValueError):
        return None


class SessionHealth:
    def __init__(
        self,
        policy: HealthPolicy,
        rank: int,
        world_size: int,
        local_world_size: int,
        control_dir: Path | None,
        engine: Any,
        lr_scheduler: Any = None,
    ) -> None:
        self.policy = policy
        self.monitor = HealthMonitor(policy, rank, world_size, local_world_size) if policy.enabled else None
        self.engine, self.lr_scheduler = engine, lr_scheduler
        self.rollbacks = 0
        self.loss: float | None = None
        self.grad_norm: float | None = None
        self.samples = 0
        self._metrics: IO[str] | None = None
        if rank == 0 and control_dir is not None:
            control_dir.mkdir(parents=True, exist_ok=True)
            self._metrics = open(control_dir / METRICS_FILE, "a", buffering=1)  # noqa: SIM115 - kept open
        self._last = time.perf_counter()
        if control_dir is not None:
            register_stack_dump(control_dir, rank)  # the agent asks for the stacks when the run hangs
        module = getattr(engine, "model", None) or getattr(getattr(engine, "engine", None), "module", None)
        if self.monitor is not None and module is not None:
            self.monitor.attach(getattr(module, "module", module))  # DDP/FSDP wrap the module that runs forward

    def step_done(self, loss: Any, grad_norm: Any, samples: int | None) -> None:
        self.loss = _float(loss)
        self.grad_norm = _float(grad_norm)
        if self.grad_norm is None:  # DeepSpeed computes it when it clips; reading it costs nothing
            getter = getattr(getattr(self.engine, "engine", None), "get_global_grad_norm", None)
            self.grad_norm = _float(getter()) if getter is not None else None
        self.samples = samples or 0

    def extra(self, step: int) -> list[int] | None:
        if self.monitor is None:
            return None
        self.monitor.record(self.loss, self.grad_norm)
        return self.monitor.extra(step)

    def judge(self, step: int, reduced: tuple[int, ...]) -> HealthAnomaly | None:
        self._write_metrics(step)
        if self.monitor is None:
            return None
        finding = self.monitor.judge(step, reduced)
        spent = self.rollbacks >= self.policy.max_rollbacks
        if finding is not None and finding.action is HealthAction.ROLLBACK and spent:
            finding = finding.model_copy(
                update={
                    "action": HealthAction.STOP,
                    "detail": f"{finding.detail}; {self.rollbacks} rollback(s) already spent (max_rollbacks)",
                }
            )
        if finding is not None:
            log.warning("health: %s at step %d -> %s (%s)", finding.kind, step, finding.action, finding.detail)
        return finding

    def rolled_back(self, to_step: int) -> None:
        self.rollbacks += 1
        if self.monitor is not None:
            self.monitor.forget_after(to_step)

    def _write_metrics(self, step: int) -> None:
        now = time.perf_counter()
        step_s, self._last = now - self._last, now
        if self._metrics is None:
            return
        row: dict[str, Any] = {"step": step, "step_s": round(step_s, 6)}
        if self.loss is not None and math.isfinite(self.loss):
            row["loss"] = self.loss
        if self.grad_norm is not None and math.isfinite(self.grad_norm):
            row["grad_norm"] = self.grad_norm
        if self.samples and step_s > 0:
            row["samples_s"] = round(self.samples / step_s, 3)
        lr = self._lr()
        if lr is not None:
            row["lr"] = lr
        try:
            self._metrics.write(json.dumps(row) + "\n")
        except OSError as exc:  # a full disk must not stop training; the checkpoint will complain
            log.warning("metrics line not written: %s", exc)

    def _lr(self) -> float | None:
        if self.lr_scheduler is not None and hasattr(self.lr_scheduler, "get_last_lr"):
            return _float(self.lr_scheduler.get_last_lr()[0])
        optimizer = getattr(self.engine, "optimizer", None) or getattr(
            getattr(self.engine, "engine", None), "optimizer", None
        )
        groups = getattr(optimizer, "param_groups", None)
        return _float(groups[0].get("lr")) if groups else None

    def close(self) -> None:
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None
