"""The end of an attempt and its recovery: the one typed contract the workflow carries.

- :class:`Verdict` names every way a wait can end. The services build verdicts from it and the
  ASL's Choice states route on its values (a test checks that the two sets are the same).
- :class:`AttemptEnd` is the classification, decided once by ``services/waits.settle`` (or by
  ``recover`` for a timed-out wait, which nobody settled) and sent through the task token as the
  ``$.outcome`` of the execution.
- :class:`RecoveryPlan` is what ``recover`` decided (``$.recovery``): which survivors stay, which
  ranks to launch and where. ``plan`` and ``provision`` execute it; they do not decide again.
- :class:`LaunchPlan` is what ``plan`` hands ``provision`` (``$.plan``).

Gang size (elastic gangs, ``resources.min_nodes``): every attempt trains ranks ``0..world_size-1``.
A :class:`Candidate` carries the ``nodes`` (world size) it was scored for; ``LaunchPlan.ranks_for``
says which ranks provision launches there and in which world; :class:`Launched` reports the
``world_size`` that trains; the RESTART directive tells kept nodes the new ``world_size``.
``Verdict.MIGRATE`` is a voluntary move decided at a review (``services/review.py``) with its
``target``; ``services/migrate.py`` launches the new gang first, then the old ranks save and drain.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from spotrelay.domain.models import Pool


class Verdict(StrEnum):
    READY = "ready"
    """Ready wait: every node of the attempt reported NodeReady (the one verdict that ends no attempt)."""
    SUCCEEDED = "succeeded"
    """Every rank finished training."""
    INTERRUPTED = "interrupted"
    """Spot reclaimed at least one node (announced); resume from the emergency checkpoint."""
    NODE_LOST = "node-lost"
    """A node vanished without notice; resume from the last committed checkpoint."""
    USER_ERROR = "user-error"
    """The training code failed; the spec's restart policy decides."""
    INFRA_ERROR = "infra-error"
    """Rendezvous, network, disk or a kill by signal under healthy user code."""
    CANCELLED = "cancelled"
    """Stopped on request; never retried."""
    READY_TIMEOUT = "ready-timeout"
    """The ready wait timed out (the ASL's ReadyTimedOut): some node never came up."""
    HEARTBEAT_TIMEOUT = "heartbeat-timeout"
    """The outcome wait missed its heartbeat (the ASL's OutcomeTimedOut): the gang went silent."""
    MIGRATE = "migrate"
    """A review (``services/review.py``) chose a clearly better placement (``target``): the workflow's
    Migrate state launches it first, then the old ranks save by its expected ready time and drain.
    Ends the attempt only once the new gang launched; no retry budget, no cooldown."""
    REBALANCE = "rebalance"
    """A rebalance recommendation with ``recovery.prewarm_on_rebalance``: boot a standby for
    ``lost_ranks`` until ``deadline`` (the ASL's Prewarm), then wait again. Ends no attempt."""

    @property
    def timed_out(self) -> bool:
        return self in (Verdict.READY_TIMEOUT, Verdict.HEARTBEAT_TIMEOUT)

    @property
    def retryable(self) -> bool:
        return self not in (Verdict.READY, Verdict.SUCCEEDED, Verdict.CANCELLED, Verdict.REBALANCE)

    @property
    def ended_by_the_job(self) -> bool:
        """The job ended the attempt itself (a move, the end of training, a stop, its own code's failure):
        nothing took its gang. Every other end is a loss (``gang_lost``)."""
        return self in _JOB_ENDS


_JOB_ENDS = frozenset({Verdict.MIGRATE, Verdict.SUCCEEDED, Verdict.CANCELLED, Verdict.USER_ERROR})


def gang_lost(end_reason: str | None) -> bool:
    """Whether an attempt that ended with ``end_reason`` (a Verdict value) lost its gang: the market or
    the machines took it (a reclaim, a vanished node, a gang that never came up or went silent, an
    infrastructure failure), not the job. The one reading of an end that the placement review's
    evidence and the elastic advice share. A record without a reason (an older release's) counts as
    lost; so does a reason this release does not know (no end is taken for the job's own by accident)."""
    return end_reason not in _JOB_ENDS  # (a StrEnum's members equal their values)


class Candidate(BaseModel):
    """A (pool, gang size) pair placement ranked; ``score`` is USD per useful hour of the full gang's work."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    pool: Pool
    price_per_hour: float = Field(..., ge=0)
    score: float
    nodes: int | None = Field(None, ge=1, description="world size if launched here; None: the plan's")
    loss_interval_s: float | None = Field(
        None, gt=0, description="placement's mean seconds between the gang's losses without a notice here "
        "(the auto checkpoint cadence's input, domain/cadence.py); None: none expected")


class ReviewBackoff(BaseModel):
    """When the next full placement review is due (placement/cadence.py): the polls between only read
    the prices. A full review that stays writes a new one; a new attempt starts without (due at once)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    due: float = Field(..., ge=0, allow_inf_nan=False)  # epoch s: the first poll from then on scores and decides
    gap_s: int = Field(..., ge=1)  # the backoff interval that ends at ``due`` (the next stay doubles it)


class AttemptEnd(BaseModel):
    """How a wait ended (field ``outcome``, routed on by the ASL as ``$.outcome.outcome``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    outcome: Verdict
    attempt: int = Field(0, ge=0)
    reason: str = ""
    lost_ranks: tuple[int, ...] = ()  # ranks whose nodes must be replaced
    exit_code: int | None = None  # the code that decided the verdict, if any
    rank: int | None = None  # the rank that reported it
    saved: bool | None = None  # interrupted: every rank's emergency save committed
    # a spot notice ended the attempt while its ranks still save: they finish by this time (epoch s)
    # and the replacements boot meanwhile (recovery.launch_at_notice)
    deadline: float | None = None
    target: Candidate | None = None  # MIGRATE: the (pool, gang size) the review moves to
    # READY from a review: the outcome wait's next timeout, the next poll (placement/cadence.poll_s),
    # which the ASL's NextReview state copies to $.launch.review_s
    review_s: int | None = Field(None, ge=1)
    # READY from a review: the mark of the prices the last full review read (placement/cadence.price_mark;
    # None: none yet), which NextReviewMark copies to $.launch.review_mark
    review_mark: str | None = Field(None, max_length=64)
    # READY from a review: when the next full review is due (NextReviewBackoff: $.launch.review_backoff)
    review_backoff: ReviewBackoff | None = None

    @property
    def retryable(self) -> bool:
        return self.outcome.retryable

    def as_loss(self, vanished: list[int]) -> AttemptEnd:
        """A crash that echoes peers whose instances vanished is their loss, not the code's error."""
        lost = tuple(sorted(set(self.lost_ranks) | set(vanished)))
        return self.model_copy(update={
            "outcome": Verdict.NODE_LOST, "lost_ranks": lost, "exit_code": None, "rank": None,
            "reason": f"nodes of ranks {sorted(vanished)} vanished ({self.reason})"})


class RecoveryAction(StrEnum):
    NEW_CLUSTER = "new-cluster"
    """Release every survivor; launch the whole gang in the best pool."""
    REPLACE_LOST = "replace-lost"
    """Survivors keep their instances and local tier; launch only ``launch_ranks`` in ``pool``."""
    RESTART_IN_PLACE = "restart-in-place"
    """Every rank survived: the same instances restart training, nothing is launched."""


class Promotion(BaseModel):
    """A hot spare that takes a lost rank (it restarts from its own local tier, no boot)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    rank: int = Field(..., ge=0)
    instance_id: str


class RecoveryPlan(BaseModel):
    """What ``recover`` decided; ``plan`` and ``provision`` execute it. The ASL's Init state is the
    empty plan (a new cluster, nothing kept)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    action: RecoveryAction = RecoveryAction.NEW_CLUSTER
    outcome: Verdict | None = None  # the end this recovers from (None before the first attempt)
    reason: str = ""
    backoff_s: int = Field(0, ge=0)
    recoveries: int = 0
    user_restarts: int = 0
    pool: Pool | None = None  # the survivors' pool (replace-lost / restart-in-place)
    keep_instance_ids: list[str] = Field(default_factory=list)
    launch_ranks: list[int] = Field(default_factory=list)  # ranks to launch in ``pool`` (keeping plans)
    promoted: list[Promotion] = Field(default_factory=list)  # lost ranks hot spares take (not launched)
    # a notice's or a move's save deadline (plus grace): survivors plan must drop drain until then
    deadline: float | None = None

    @property
    def keeps(self) -> bool:
        return self.action is not RecoveryAction.NEW_CLUSTER and bool(self.keep_instance_ids) \
            and self.pool is not None


class LaunchPlan(BaseModel):
    """What ``plan`` hands ``provision``: try the candidates in order with these ranks."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    candidates: list[Candidate]
    launch_ranks: list[int]  # [] is meaningful: every rank survived (restart in place)
    keep_instance_ids: list[str] = Field(default_factory=list)
    promoted: list[Promotion] = Field(default_factory=list)
    # the attempt's world size when a candidate does not say (None: kept + promoted + launched ranks)
    world_size: int | None = Field(None, ge=1)
    # > 0: no candidate now, every allowed pool cools down; the workflow waits this long and plans again
    wait_s: int = Field(0, ge=0)

    @property
    def keeps(self) -> bool:
        return bool(self.keep_instance_ids or self.promoted)

    def ranks_for(self, candidate: Candidate) -> tuple[int, list[int]]:
        """(world size, ranks to launch) if ``candidate`` is the pool that takes the launch.

        A new gang (nothing kept) launches ranks ``0..n-1`` with ``n`` the candidate's size; a keeping
        plan launches ``launch_ranks`` and its world is ``world_size`` (or every rank it names)."""
        if not self.keeps and candidate.nodes is not None:
            return candidate.nodes, list(range(candidate.nodes))
        world = self.world_size or candidate.nodes or (
            len(self.keep_instance_ids) + len(self.promoted) + len(self.launch_ranks))
        return world, list(self.launch_ranks)


class Launched(BaseModel):
    """What ``provision`` launched (``$.launch``): the attempt the waits then watch."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    attempt: int = Field(..., ge=1)
    pool: Pool | None = None
    price_per_hour: float = 0.0
    nodes: int = 0  # instances billed (hot spares included)
    world_size: int = Field(0, ge=0, description="ranks that train in this attempt (0: unknown)")
    # the outcome wait's TimeoutSecondsPath: the next review of the placement (services/review.py)
    review_s: int = Field(1800, ge=1)
    # the prices the last full review read (placement/cadence.price_mark): None for a new attempt, whose
    # first review has nothing to compare with; the Review task is given it (``$.launch.review_mark``)
    review_mark: str | None = Field(None, max_length=64)
    # when the next full review is due: None for a new attempt (its first review is one); the Review
    # task is given it (``$.launch.review_backoff``)
    review_backoff: ReviewBackoff | None = None
