"""What a simulated run keeps: its nodes, the scripted faults it replays and what it measures
(``engine.Run`` moves them; policies read them)."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

from spotrelay.sim.market import SimPool

INF = float("inf")


@dataclass(slots=True, eq=False)
class SimNode:
    rank: int
    pool: SimPool
    key: Hashable  # (not ``object``: mypyc's dataclasses cannot name a builtin, spotrelay/sim_native.py)
    attempt: int
    instance_id: str
    launch_t: float
    boot_t: float
    removal_t: float
    announced: bool
    state: str = "PENDING"  # a NodeState value
    exit_code: int | None = None
    end_t: float | None = None  # billing stopped
    spare: bool = False  # a hot spare on the bench (booted, billed, out of training)
    takes_rank: int | None = None  # a spare a recovery promoted to this rank
    release_after: float | None = None  # a rebalance standby: released then unless a rank took it
    record: tuple[tuple[object, ...], Any] | None = None  # (what it was built from, its Node record): controller
    trained_s: float = 0.0  # seconds in training segments (sim/losses.py)
    train_end: float = 0.0  # when its last training segment ended
    restored_s: float = 0.0  # seconds of restore windows before its segments
    left_to_ec2: bool = False  # released after EC2's notice in its first hour: EC2 takes it, unbilled
    crashed: bool = False  # a scripted kill (the twin's): a crash, not EC2's interruption (billed)


@dataclass(frozen=True, slots=True)
class Fault:
    """A scripted reclaim (the twin's chaos): ``notice`` (announced) or ``kill`` (unannounced) of
    ``rank`` when attempt ``attempt`` reaches ``step``; ``rebalance``: a rebalance recommendation
    then, and the notice ``lead_s`` later."""

    kind: str
    rank: int
    step: int
    attempt: int
    lead_s: float = 600.0


@dataclass
class Metrics:
    interruptions: int = 0  # attempts ended by a reclaim or a loss
    moves: int = 0  # voluntary moves a placement review made (spotrelay)
    recoveries: int = 0  # restarts of training after one
    steps_lost: int = 0
    recovery_s: list[float] = field(default_factory=list)
    cross_region_moves: int = 0
    capacity_failures: int = 0
    finished: bool = False
    deadline_cut: bool = False  # the job's deadline stopped it before its steps were done
    failed_reason: str | None = None
    events: int = 0
    timeline: list[tuple[float, str, str]] = field(default_factory=list)  # (t, pool key, what)
