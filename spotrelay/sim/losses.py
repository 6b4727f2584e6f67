"""Where paid GPU-hours that did not become training go: each billed node's life split into phases.

A node is billed from launch to its end (terminated, reclaimed, released). Its life is:

- ``boot``: launch -> booted (or its end, if it never booted);
- training time, split over the whole run into ``useful`` (steps that reach the final model; goodput),
  ``checkpoint_stall`` (the periodic snapshot's stall spread over the steps) and ``lost_work`` (steps
  trained and then redone from an older checkpoint);
- ``restore``: the restore window (bring-up + shard load, ``JobModel.restore_s``) before each training
  segment the node joins;
- ``idle``: booted, not training, not restoring, before its last segment ended: waiting for the rest of
  the gang to boot, or a survivor waiting through a recovery (plan, launch, the replacement's boot);
- ``drain``: after its last segment until billing stops (a doomed rank's save and exit, survivors
  released by a plan, the gang's teardown);
- ``never_trained``: booted but never in a training gang (a gang lost while booting or restoring, a
  launch a plan dropped); ``spare``: the same for a hot spare or standby that never took a rank.

All are paid GPU-hours weighted by the type's speed (as goodput's denominator), so the shares sum to 1.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

CATEGORIES = ("useful", "checkpoint_stall", "lost_work", "boot", "restore", "idle", "drain", "never_trained",
              "spare")


def node_phases(node: Any, end: float) -> dict[str, float]:
    """Seconds of ``node``'s billed life per phase other than training (training is ``node.trained_s``)."""
    life = end - node.launch_t
    boot = min(node.boot_t, end) - node.launch_t
    if node.trained_s <= 0.0:
        rest = life - boot
        return {"boot": boot, ("spare" if node.spare or node.release_after is not None else "never_trained"): rest}
    drain = end - node.train_end
    idle = life - boot - node.trained_s - node.restored_s - drain
    return {"boot": boot, "restore": node.restored_s, "idle": max(0.0, idle), "drain": drain}


def charge_node(losses: dict[str, float], node: Any, end: float, weight: float) -> None:
    """Add ``node``'s billed life to ``losses`` (paid GPU-s per phase; ``weight``: its GPUs x the
    type's speed) when its billing stops at ``end``; its training seconds go to "train"."""
    for phase, seconds in node_phases(node, end).items():
        losses[phase] = losses.get(phase, 0.0) + seconds * weight
    losses["train"] = losses.get("train", 0.0) + node.trained_s * weight


def segment_started(nodes: Iterable[Any], now: float, restore_s: float) -> None:
    """A training segment starts at ``now``: each node restored for up to ``restore_s`` before it
    (what it waited beyond that, since it booted or last trained, is idle)."""
    for n in nodes:
        n.restored_s += min(restore_s, max(0.0, now - max(n.boot_t, n.train_end)))


def segment_ended(losses: dict[str, float], nodes: Iterable[Any], now: float, took: float, stall: float,
                  speed: Callable[[Any], float]) -> None:
    """The segment's ``nodes`` trained ``took`` seconds until ``now``, ``stall`` of them the periodic
    snapshot's stall (charged to "checkpoint_stall" at each node's GPUs x ``speed(node)``)."""
    stalled = 0.0
    for n in nodes:
        n.trained_s += took
        n.train_end = now
        stalled += stall * n.pool.gpus * speed(n)
    losses["checkpoint_stall"] = losses.get("checkpoint_stall", 0.0) + stalled


def shares(run: Any) -> dict[str, float]:
    """Each category's share of ``run``'s paid GPU-hours (sums to 1 up to rounding; {} when nothing was paid)."""
    paid = run.paid_gpu_s
    if paid <= 0.0:
        return {}
    got = dict(run.loss_gpu_s)
    useful = run.useful_gpu_hours() * 3600.0
    train = got.pop("train", 0.0)
    stall = got.get("checkpoint_stall", 0.0)
    out = {"useful": useful / paid, "checkpoint_stall": stall / paid,
           "lost_work": max(0.0, train - stall - useful) / paid}
    for cat in CATEGORIES[3:]:
        out[cat] = got.get(cat, 0.0) / paid
    return out
