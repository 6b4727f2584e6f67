"""Capacity: gang launches and termination (EC2 CreateFleet in AWS, local processes in the twin)."""

from __future__ import annotations

from typing import Protocol

from pydantic import BaseModel, ConfigDict

from spotrelay.domain.models import Pool


class LaunchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    job_id: str
    attempt: int
    pool: Pool
    count: int
    ranks: list[int]  # one rank per instance, in launch order
    # ranks in the whole gang (the training world): a replacement or a spare is launched alone but
    # trains in a gang of this size; None: ``count``
    gang: int | None = None
    user_data: str = ""
    config_uri: str = ""  # where the agent reads the job spec
    # the spec's checkpoint.s3_prefix (a resumed job's: the stopped job's checkpoints), which the
    # node's role must reach; "": the job's own checkpoints/<job>/
    checkpoint_prefix: str = ""
    dataset_uris: list[str] = []  # the spec's dataset.uri and replicas: the node's role may read them


class Instance(BaseModel):
    model_config = ConfigDict(extra="forbid")
    instance_id: str
    pool: Pool
    rank: int
    private_ip: str | None = None
    state: str = "pending"
    job_id: str | None = None
    attempt: int | None = None


class Compute(Protocol):
    def launch(self, request: LaunchRequest) -> list[Instance]:
        """All ``count`` instances or none: a partial fleet is terminated and
        ``InsufficientCapacityError`` raised; ``QuotaExceededError`` for limits."""

    def terminate(self, instance_ids: list[str], region: str) -> None: ...

    def spot_reclaimed(self, instance_id: str, region: str) -> bool:
        """Whether EC2 itself took this instance back as a spot interruption (not a crash, nor our or
        someone's terminate): a loss whose notice never reached us is still EC2's interruption, and
        one in the instance's first hour is not billed. False when it cannot be told."""

    def expected_boot_s(self, pool: Pool) -> float:
        """Seconds from a launch in ``pool`` to the agent's NodeReady (a move's old gang saves by then)."""

    def terminate_job(self, job_id: str, regions: list[str]) -> list[str]:
        """Terminate every instance tagged with the job; return their ids."""

    def list_tagged(self, regions: list[str]) -> list[Instance]:
        """Every live instance carrying spotrelay tags (for reconcile's orphan sweep)."""

    def job_profiles(self, skip: frozenset[str] = frozenset()) -> list[str]:
        """Job ids that still have a per-job agent role, except those in ``skip`` (reconcile's live
        jobs: their roles are not even read), for reconcile's leak sweep."""

    def delete_job_profile(self, job_id: str) -> None:
        """Delete a job's agent role and instance profile (gone already is fine)."""
