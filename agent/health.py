"""Training health checks inside the session: cheap per-rank observations, agreed across ranks.

Each step every rank computes a few integers (loss or grad norm not finite; the loss's robust
z-score against the recent window; the grad norm against its window median) and, every
``straggler_every`` steps, its mean "own" step time in its own slot of a world-sized vector. They
ride in the same all-reduce(MAX) as the stop decision (:func:`agent.stop.agree`), so every rank
sees the same numbers and reaches the same verdict at the same step, without a second collective.

A rank's own time runs from the end of the previous step's boundary to the end of its model's
last forward pass in the step (a forward hook): in synchronous data parallelism the other parts of
a step end together, because the fast ranks wait for the slow one inside the gradient all-reduce.
Without a module to hook, the whole step's wall time is used.

Only healthy steps enter the history, so a spike does not raise the bar for the next one.
"""

from __future__ import annotations

import math
import time
from collections import deque
from typing import Any

from spotrelay.contracts.health import AnomalyKind, HealthAnomaly, HealthPolicy

MILLI = 1000  # z-scores and ratios travel as integer thousandths in the int64 all-reduce
_FLAGS = 3  # non-finite, loss z (milli), grad-norm ratio (milli)


def robust_z(value: float, history: list[float]) -> float:
    """(value - median) / (1.4826 * MAD), one-sided (only rises count); 0 with too little history."""
    if len(history) < 5:
        return 0.0
    ordered = sorted(history)
    median = ordered[len(ordered) // 2]
    mad = sorted(abs(v - median) for v in ordered)[len(ordered) // 2]
    scale = max(1.4826 * mad, 1e-3 * abs(median), 1e-12)  # a flat loss must not make every wiggle a spike
    return max(0.0, (value - median) / scale)


def _clip(value: float) -> int:
    return int(min(value, 2.0**40) * MILLI)


class HealthMonitor:
    def __init__(self, policy: HealthPolicy, rank: int, world_size: int, local_world_size: int = 1) -> None:
        self.policy, self.rank, self.world = policy, rank, world_size
        self.local_world = max(local_world_size, 1)
        self.losses: deque[tuple[int, float]] = deque(maxlen=policy.window)
        self.norms: deque[tuple[int, float]] = deque(maxlen=policy.window)
        self.loss: float | None = None
        self.grad_norm: float | None = None
        self._own_s = 0.0
        self._own_n = 0
        self._slow = [0] * world_size
        self._step_start = time.perf_counter()
        self._forward_end = 0.0
        self.spent_s = 0.0  # time the checks themselves took (the bench reports it)
        # steps this process observed: its history starts empty at every (re)start, so the warm-up counts
        # from there too (a resume judged 5 fresh losses against each other: false spikes, skipped data)
        self._observed = 0

    # --- observing ---------------------------------------------------------------------------------
    def attach(self, module: Any) -> None:
        """Time the end of the rank's forward pass (see the module docstring)."""
        if hasattr(module, "register_forward_hook"):
            module.register_forward_hook(self._on_forward)

    def _on_forward(self, *_: Any) -> None:
        self._forward_end = time.perf_counter()

    def record(self, loss: float | None, grad_norm: float | None) -> None:
        self.loss, self.grad_norm = loss, grad_norm

    def extra(self, step: int) -> list[int]:
        """This rank's values for the agreed all-reduce after ``step`` steps are done."""
        t0 = time.perf_counter()
        p = self.policy
        own = (self._forward_end if self._forward_end > self._step_start else t0) - self._step_start
        self._own_s, self._own_n = self._own_s + own, self._own_n + 1
        loss, norm = self.loss, self.grad_norm
        bad = any(v is not None and not math.isfinite(v) for v in (loss, norm))
        self._observed += 1
        warm = step > p.warmup_steps and self._observed > p.warmup_steps
        z = ratio = 0.0
        if warm and not bad and loss is not None and p.loss_spike_z is not None:
            z = robust_z(loss, [v for _, v in self.losses])
        if not bad and norm is not None:
            if p.grad_norm_max is not None and norm > p.grad_norm_max:
                ratio = float("inf")
            elif warm and p.grad_norm_factor is not None and len(self.norms) >= 5:
                ordered = sorted(v for _, v in self.norms)
                ratio = norm / max(ordered[len(ordered) // 2], 1e-12)
        values = [int(bad), _clip(z), _clip(ratio)]
        if self._straggler_due(step):
            times = [0] * self.world
            times[self.rank] = int(self._own_s / max(self._own_n, 1) * 1e6)
            values += times
            self._own_s, self._own_n = 0.0, 0
        self.spent_s += time.perf_counter() - t0
        return values

    def _straggler_due(self, step: int) -> bool:
        p = self.policy
        return (p.straggler_factor is not None and self.world > 1 and step > p.warmup_steps
                and step % p.straggler_every == 0)  # fmt: skip

    # --- judging -----------------------------------------------------------------------------------
    def judge(self, step: int, reduced: tuple[int, ...]) -> HealthAnomaly | None:
        """The finding every rank reaches from the same reduced values (None: healthy)."""
        t0 = time.perf_counter()
        try:
            return self._judge(step, reduced)
        finally:
            self._step_start = time.perf_counter()
            self.spent_s += self._step_start - t0

    def _judge(self, step: int, reduced: tuple[int, ...]) -> HealthAnomaly | None:
        p = self.policy
        bad, z, ratio = reduced[0], reduced[1] / MILLI, reduced[2] / MILLI
        finding: HealthAnomaly | None = None
        if bad:
            finding = self._finding(AnomalyKind.NON_FINITE, step, None, "loss or gradient norm is NaN/Inf")
        elif p.grad_norm_max is not None and ratio >= 2.0**40:
            finding = self._finding(AnomalyKind.GRAD_EXPLOSION, step, None, f"grad norm above {p.grad_norm_max}")
        elif p.grad_norm_factor is not None and ratio > p.grad_norm_factor:
            finding = self._finding(
                AnomalyKind.GRAD_EXPLOSION,
                step,
                ratio,
                f"grad norm {ratio:.1f}x its median over the last {len(self.norms)} steps",
            )
        elif p.loss_spike_z is not None and z > p.loss_spike_z:
            finding = self._finding(
                AnomalyKind.LOSS_SPIKE, step, z, f"loss robust z-score {z:.1f} over the last {len(self.losses)} steps"
            )
        if finding is None:
            if self.loss is not None:
                self.losses.append((step, self.loss))
            if self.grad_norm is not None:
                self.norms.append((step, self.grad_norm))
            if len(reduced) > _FLAGS:
                finding = self._straggler(step, [v / 1e6 for v in reduced[_FLAGS:]])
        self.loss = self.grad_norm = None
        return finding

    def _straggler(self, step: int, times: list[float]) -> HealthAnomaly | None:
        factor = self.policy.straggler_factor
        assert factor is not None
        ordered = sorted(times)
        median = max(ordered[(len(ordered) - 1) // 2], 1e-9)  # lower median: one slow rank of two counts
        worst = max(range(len(times)), key=lambda r: times[r])
        slow = times[worst] > factor * median and times[worst] - median >= self.policy.straggler_min_s
        for r in range(len(times)):
            self._slow[r] = self._slow[r] + 1 if r == worst and slow else 0
        if self._slow[worst] < self.policy.straggler_checks:
            return None
        self._slow[worst] = 0
        ratio = times[worst] / median
        return self._finding(AnomalyKind.STRAGGLER, step, ratio,
                             f"rank {worst} took {ratio:.2f}x the median step time ({times[worst] * 1e3:.1f} ms "
                             f"vs {median * 1e3:.1f} ms)", rank=worst)  # fmt: skip

    def _finding(self, kind: AnomalyKind, step: int, value: float | None, detail: str,
                 rank: int | None = None) -> HealthAnomaly:  # fmt: skip
        return HealthAnomaly(kind=kind, action=self.policy.action(kind), step=step, rank=rank,
                             node_rank=None if rank is None else rank // self.local_world,
                             value=value, detail=detail)  # fmt: skip

    def forget_after(self, step: int) -> None:
        """After a rollback to ``step``: history from the discarded steps no longer counts."""
        for history in (self.losses, self.norms):
            kept = [(s, v) for s, v in history if s <= step]
            history.clear()
            history.extend(kept)
        self._own_s, self._own_n = 0.0, 0
        self._slow = [0] * self.world
