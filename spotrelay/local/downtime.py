"""Downtime per fault, measured in the twin and modeled with EC2's real timings (docs/local-twin.md).

Measured: ``downtime_s = resumed - stopped``: from the moment training stopped (the step boundary
where the last save of the interrupted attempt started; the fault itself for an unannounced loss)
to the first step the next attempt finished at full size.

Modeled: the same fault with the modeled boot ``B`` (300 s) in place of the twin's scaled one and
EC2's 120 s notice window ``W`` in place of the twin's shortened ``w``. With times relative to the
fault (the notice), ``S`` = when training stopped, ``L`` = when the replacement was launched,
``r`` / ``a`` / ``e`` = replacement booted / training stopped / training resumed (absolute), and
``D = W - w`` for a notice (0 for an unannounced loss):

    S' = S + D                   the longer window is training: the final save is timed from the
                                 deadline, so stop -> reclaim takes as long as it did here
    L' = L        if L < S       launched during the window (by the notice): does not move
       = L + D    otherwise      launched after training stopped: moves with the stop
    P  = e - max(r, a)           rendezvous, restore and the first step, measured: what followed
                                 once both the old gang had stopped and the replacement was up
    downtime_modeled = max(L' + B - S', 0) + P

Only what happened here is carried over: a boot that did not overlap training here does not
overlap it in the model (then the formula is ``measured - boot_here + B``), and ``P`` is taken
whole even where the model's later boot would have hidden part of it. Without a new node (a spare
or survivors only) there is no boot in the path and the modeled downtime is the measured one.
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


@dataclass(frozen=True)
class Downtime:
    downtime_s: float
    downtime_modeled_s: float
    window_training_share: float | None  # of the twin's window, measured
    window_training_share_modeled: float | None  # of EC2's 120 s window, stop -> reclaim as measured


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
    if t.launched_at is None or t.booted_at is None:
        modeled = measured
    else:
        stop = t.stopped_at - t.fault_at + shift
        launch = t.launched_at - t.fault_at
        if t.launched_at >= t.stopped_at:
            launch += shift
        after = t.resumed_at - max(t.booted_at, t.stopped_at)
        modeled = max(launch + boot_modeled_s - stop, 0.0) + after
    return Downtime(
        downtime_s=measured,
        downtime_modeled_s=modeled,
        window_training_share=window_share(t, t.window_s),
        window_training_share_modeled=window_share_modeled(t, window_real_s),
    )
