"""Downtime per fault, measured in the twin and modeled with EC2's real timings (docs/local-twin.md).

Measured: ``downtime_s = resumed - stopped``: from the moment training stopped (the step boundary
where the last save of the interrupted attempt started; the instance's end for an unannounced loss)
to the first step the next attempt finished at full size (the trainers' ``first_step`` events).

Modeled: the same fault with the modeled boot ``B`` (300 s) in place of the twin's scaled one and
EC2's 120 s notice window ``W`` in place of the twin's shortened ``w``. With times relative to the
fault (the notice), ``S`` = when training stopped, ``L`` = when the replacement was launched, and
absolute times ``a`` (training stopped), ``r`` (the replacement booted: its agent started), ``q``
(its agent ready to start the training command: registered, nothing of its own left to do), ``g``
(it started the training command) and ``e`` (training resumed); ``D = W - w`` for a notice (0 for
an unannounced loss):

    S' = S + D                   the longer window is training: the final save is timed from the
                                 deadline, so stop -> reclaim takes as long as it did here
    L' = L        if L < S       launched during the window (by the notice): does not move
       = L + D    otherwise      launched after training stopped: moves with the stop
    N  = L' + B + (q - r) - S'   the new node's own path to its training command: the modeled
                                 boot, then its agent's start-up as measured
    O  = g - a                   the old gang's path to the same point, measured: the final save,
                                 the drain, the survivors' re-registration, the workflow
    P  = e - g                   training command -> first step at full size (rendezvous, imports,
                                 restore), measured
    downtime_modeled = max(N, O) + P

Only what happened here is carried over. N and O overlap in the model because neither waits for
the other (the old gang never waits for the new node; the new node's gate waits for the old gang,
which is O): O is the measured path, N the boot in place of the twin's. A replacement launched
after training stopped pays the whole boot (``measured - boot_here + B``), and ``P`` is taken whole.
Without ``q``/``g`` (no agent log) ``P = e - max(r, a)`` and ``N`` has no start-up term. Without a
new node (a spare or survivors only) there is no boot in the path: modeled = measured.
"""

from __future__ import annotations

from dataclasses import dataclass

EC2_NOTICE_WINDOW_S = 120.0


@dataclass(frozen=True)
class FaultTimes:
    kind: str  # spot-notice | node-lost
    fault_at: float  # the notice (or the loss)
    stopped_at: float  # training stopped
    resumed_at: float | None  # the next attempt's first step at full size
    launched_at: float | None = None  # the newest replacement launch for the next attempt; None: none
    booted_at: float | None = None  # that replacement's agent up
    window_s: float | None = None  # the twin's notice window (notices only)
    final_commit_at: float | None = None  # the interrupted attempt's last emergency commit
    reclaim_at: float | None = None  # the deadline the notice gave
    ready_at: float | None = None  # the replacement's agent ready to start training (q)
    started_at: float | None = None  # the replacement started its training command (g)


@dataclass(frozen=True)
class Downtime:
    downtime_s: float
    downtime_modeled_s: float
    window_training_share: float | None  # of the twin's window, measured
    window_training_share_modeled: float | None  # of EC2's 120 s window, stop -> reclaim as measured
    parts: dict[str, float] | None = None  # the modeled path: new_node (N), old_gang (O), restart (P)


def window_share(t: FaultTimes, window_s: float | None) -> float | None:
    if t.kind != "spot-notice" or not window_s:
        return None
    return min(max((t.stopped_at - t.fault_at) / window_s, 0.0), 1.0)


def window_share_modeled(t: FaultTimes, window_real_s: float = EC2_NOTICE_WINDOW_S) -> float | None:
    """The share of EC2's window spent training when stop -> reclaim takes what it took here."""
    if t.kind != "spot-notice" or not t.window_s:
        return None
    tail = max(t.fault_at + t.window_s - t.stopped_at, 0.0)
    return min(max(1 - tail / window_real_s, 0.0), 1.0)


def downtime(t: FaultTimes, boot_modeled_s: float, window_real_s: float = EC2_NOTICE_WINDOW_S) -> Downtime | None:
    """None until training resumed."""
    if t.resumed_at is None:
        return None
    measured = t.resumed_at - t.stopped_at
    notice = t.kind == "spot-notice" and t.window_s is not None
    shift = (window_real_s - t.window_s) if notice and t.window_s is not None else 0.0
    parts = None
    if t.launched_at is None or t.booted_at is None:
        modeled = measured
    else:
        stop = t.stopped_at - t.fault_at + shift
        launch = t.launched_at - t.fault_at
        if t.launched_at >= t.stopped_at:
            launch += shift
        if t.ready_at is not None and t.started_at is not None:
            own = max(t.ready_at - t.booted_at, 0.0)
            new_node = launch + boot_modeled_s + own - stop
            old_gang = t.started_at - t.stopped_at
            modeled = max(new_node, old_gang, 0.0) + (t.resumed_at - t.started_at)
            parts = {"new_node": new_node, "old_gang": old_gang, "restart": t.resumed_at - t.started_at}
        else:
            after = t.resumed_at - max(t.booted_at, t.stopped_at)
            modeled = max(launch + boot_modeled_s - stop, 0.0) + after
    return Downtime(
        downtime_s=measured,
        downtime_modeled_s=modeled,
        window_training_share=window_share(t, t.window_s),
        window_training_share_modeled=window_share_modeled(t, window_real_s),
        parts=parts,
    )
