"""Pydantic models of the job spec. Unknown fields are errors everywhere (``extra="forbid"``)."""

from __future__ import annotations

import functools
import math
import re
import types
import typing
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from spotrelay.contracts.cadence import AUTO, MinutesOrAuto
from spotrelay.contracts.health import HealthPolicy, finite_limit

REGION_RE = re.compile(r"^[a-z]{2}(-gov)?-[a-z]+-\d$")
INSTANCE_TYPE_RE = re.compile(r"^[a-z][a-z0-9-]*\d[a-z0-9-]*\.[a-z0-9]+$")
NAME_RE = r"^[a-zA-Z0-9][a-zA-Z0-9._-]{0,62}$"


def _takes_numbers_not_booleans(annotation: Any) -> bool:
    """``int``, ``float`` or a union or ``Annotated`` form holding one, and not ``bool``."""
    try:
        return _numeric(annotation)
    except TypeError:  # (an unhashable annotation: not cached)
        return _numeric.__wrapped__(annotation)


@functools.cache
def _numeric(annotation: Any) -> bool:
    todo: list[Any] = [annotation]
    flat: set[Any] = set()
    while todo:
        head = todo.pop()
        inner, origin = typing.get_args(head), typing.get_origin(head)
        if inner and origin in (typing.Union, types.UnionType, typing.Annotated):
            todo.extend(inner[:1] if origin is typing.Annotated else inner)
        else:
            flat.add(head)
    return bool(flat & {int, float}) and bool not in flat


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_booleans_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        # YAML reads true/false/yes/no/on/off as booleans, which pydantic would take as 1 and 0: a spec
        # that says `spares: no` or `nodes: true` is refused, not read as a number
        field = cls.model_fields.get(info.field_name) if info.field_name is not None else None
        if field is None:
            return value
        if isinstance(value, bool) and _takes_numbers_not_booleans(field.annotation):
            raise ValueError(f"expected a number, got {str(value).lower()}")
        items = typing.get_args(field.annotation) if typing.get_origin(field.annotation) is list else ()
        if items and isinstance(value, list) and any(isinstance(v, bool) for v in value) and \
                _takes_numbers_not_booleans(items[0]):
            raise ValueError("expected numbers, got a boolean")
        return value


class Market(StrEnum):
    SPOT = "spot"
    ON_DEMAND = "on-demand"


class Entrypoint(Strict):
    """What to run on every rank: ``command`` (argv list) or ``script`` plus ``args``."""

    command: list[str] | None = Field(None, min_length=1, description="argv, e.g. [python, train.py]")
    script: str | None = Field(None, min_length=1, description="a Python script run by the launcher")
    args: list[str] = Field(default_factory=list)
    working_dir: str = "."
    env: dict[str, str] = Field(default_factory=dict)
    code: str | None = Field(
        None, min_length=1,
        description="the training code: a local directory (`spotrelay submit` packs and uploads it) or an "
                    "s3:// .tar.gz archive; unpacked on each node, working_dir is relative to it",
    )
    code_sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$", description="sha256 of the archive")

    @model_validator(mode="after")
    def _one_of(self) -> Entrypoint:
        if (self.command is None) == (self.script is None):
            raise ValueError("give exactly one of 'command' or 'script'")
        if self.command is not None and self.args:
            raise ValueError("'args' goes with 'script'; put arguments in 'command'")
        return self

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        for key in env:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                raise ValueError(f"'{key}' is not a valid environment variable name")
        return env


class Launcher(Strict):
    type: Literal["torchrun", "deepspeed"] = "torchrun"
    deepspeed_config: dict[str, Any] | str | None = Field(
        None, description="DeepSpeed config inline, or a path relative to working_dir"
    )

    @model_validator(mode="after")
    def _config_for_deepspeed(self) -> Launcher:
        if self.type == "torchrun" and self.deepspeed_config is not None and not isinstance(
            self.deepspeed_config, (dict, str)
        ):
            raise ValueError("deepspeed_config must be a mapping or a path")
        if self.type == "deepspeed" and self.deepspeed_config is None:
            raise ValueError("the deepspeed launcher needs 'deepspeed_config'")
        return self


class Resources(Strict):
    nodes: int = Field(..., ge=1, le=512)
    min_nodes: int | None = Field(
        None, ge=1, le=512,
        description="smallest gang the job may run on while the full one cannot be placed or costs more "
        "per useful hour (default: nodes); the global batch is kept by gradient accumulation",
    )  # fmt: skip
    wall_time_weight: float | None = Field(
        None, ge=0, le=1,
        description="with min_nodes: how much the wall time a smaller gang adds counts against its saving; "
        "a gang of n nodes is charged (nodes / n) ** w per useful hour (0: cost only; 1: as if the full gang "
        "waited; default: placement's shrink_delay_weight)",
    )  # fmt: skip
    gpus_per_node: int = Field(8, ge=0, le=16, description="0 runs on CPU (the local twin)")
    instance_types: list[str] = Field(
        default_factory=lambda: ["p5.48xlarge", "p4d.24xlarge"], min_length=1,
        description="in order of preference",
    )
    markets: list[Market] = Field(default_factory=lambda: [Market.SPOT, Market.ON_DEMAND], min_length=1)
    regions: list[str] = Field(default_factory=lambda: ["us-east-1"], min_length=1, max_length=4)
    max_hourly_price: float | None = Field(None, gt=0, description="USD per instance-hour, any market")
    spares: int = Field(0, ge=0, le=64, description="hot spares booted with the gang; they take a lost rank")

    @model_validator(mode="after")
    def _min_nodes(self) -> Resources:
        if self.min_nodes is not None and self.min_nodes > self.nodes:
            raise ValueError(f"min_nodes {self.min_nodes} is more than nodes {self.nodes}")
        return self

    @field_validator("max_hourly_price", mode="before")
    @classmethod
    def _finite_price(cls, value: Any) -> Any:
        return finite_limit(value, "leave it out for no limit")

    @property
    def smallest_gang(self) -> int:
        return self.min_nodes or self.nodes

    @field_validator("instance_types")
    @classmethod
    def _types(cls, values: list[str]) -> list[str]:
        for value in values:
            if not INSTANCE_TYPE_RE.fullmatch(value):
                raise ValueError(f"'{value}' is not an EC2 instance type like p5.48xlarge")
        if len(set(values)) != len(values):
            raise ValueError("instance types repeat")
        return values

    @field_validator("regions")
    @classmethod
    def _regions(cls, values: list[str]) -> list[str]:
        for value in values:
            if not REGION_RE.fullmatch(value):
                raise ValueError(f"'{value}' is not an AWS region like us-east-1")
        if len(set(values)) != len(values):
            raise ValueError("regions repeat")
        return values

    @field_validator("markets")
    @classmethod
    def _markets(cls, values: list[Market]) -> list[Market]:
        if len(set(values)) != len(values):
            raise ValueError("markets repeat")
        return values


S3_URI = Annotated[str, Field(pattern=r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?$")]


# a mount under one of these, or over one of the others, breaks the node
SYSTEM_DIRS = frozenset({"bin", "boot", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "run", "sbin", "sys",
                         "usr"})  # every /lib* job-spec.md names
SYSTEM_ROOTS = frozenset({"/home", "/opt", "/root", "/tmp", "/var", "/opt/pytorch", "/opt/spotrelay"})


class Fsx(Strict):
    mount_path: str = Field("/fsx", pattern=r"^(/[A-Za-z0-9_][A-Za-z0-9._-]*)+$",
                            description="an absolute folder of plain names, outside the system's own")
    storage_capacity_gib: int = Field(1200, ge=1200)

    @field_validator("mount_path")
    @classmethod
    def _not_a_system_folder(cls, path: str) -> str:
        top = path.split("/")[1]
        if top in SYSTEM_DIRS or path in SYSTEM_ROOTS or path.startswith(("/opt/pytorch/", "/opt/spotrelay/")):
            raise ValueError(f"{path} is a folder the node's system uses; mount it elsewhere (/fsx)")
        return path


class Dataset(Strict):
    uri: S3_URI
    replicas: dict[str, S3_URI] = Field(default_factory=dict, description="region -> S3 URI")
    fsx: Fsx | None = None

    @field_validator("replicas")
    @classmethod
    def _replica_regions(cls, values: dict[str, str]) -> dict[str, str]:
        for region in values:
            if not REGION_RE.fullmatch(region):
                raise ValueError(f"'{region}' is not an AWS region like us-east-1")
        return values


class Checkpoint(Strict, MinutesOrAuto):
    every_steps: int | None = Field(None, ge=1)
    every_minutes: Annotated[float, Field(gt=0)] | Literal["auto"] | None = Field(
        None, description="minutes between periodic saves, or 'auto': from the market and the measured "
        "save stall (spotrelay/domain/cadence.py), within auto_min_minutes..auto_max_minutes; auto when neither "
        "this nor every_steps is given")
    auto_min_minutes: float = Field(2.0, gt=0, le=24 * 60)
    auto_max_minutes: float = Field(60.0, gt=0, le=24 * 60)
    keep_local: int = Field(2, ge=1, le=100)
    keep_s3: int = Field(5, ge=1, le=1000)
    s3_prefix: S3_URI | None = Field(None, description="default: the jobs bucket's checkpoints/<job>/")
    local_dir: str = Field("/opt/spotrelay/checkpoints", description="fast tier: NVMe or FSx path")
    # a gang away from its checkpoints sends every save there, at AWS's inter-region price: with both
    # stated, placement weighs it (placement/policy.py, docs/placement.md "Checkpoint locality")
    size_gb: float | None = Field(None, gt=0, le=1e6, description="the whole checkpoint, every rank's shards, "
                                  "in GB: with region, placement weighs sending it from another region")
    region: str | None = Field(None, description="the region of the bucket the checkpoints go to (the home "
                               "region for the default s3_prefix): with size_gb, placement weighs the distance")

    @field_validator("region")
    @classmethod
    def _region(cls, value: str | None) -> str | None:
        if value is not None and not REGION_RE.fullmatch(value):
            raise ValueError(f"not an AWS region name like us-east-1 (got {value[:60]!r})")
        return value

    @field_validator("every_minutes", mode="before")
    @classmethod
    def _minutes_or_auto(cls, value: Any) -> Any:
        """One clear error for a value that is neither (the union would give one per branch)."""
        if value is None or value == AUTO:
            return value
        try:
            minutes = float(value) if isinstance(value, int | float | str) and not isinstance(value, bool) else None
        except ValueError:
            minutes = None
        if minutes is not None and math.isfinite(minutes) and minutes > 0:
            return minutes
        raise ValueError(f"minutes above 0, or 'auto' (got {value!r})")

    @model_validator(mode="before")
    @classmethod
    def _auto_unless_stated(cls, data: Any) -> Any:
        """A spec that states no cadence gets the market's (``auto``): every job saves periodically."""
        if isinstance(data, dict) and data.get("every_steps") is None and data.get("every_minutes") is None:
            return {**data, "every_minutes": AUTO}
        return data

    @model_validator(mode="after")
    def _interval(self) -> Checkpoint:
        self.check_auto_bounds()
        return self


class Recovery(Strict):
    # replace-lost-nodes keeps survivors while their pool is still the best choice, else a new gang
    strategy: Literal["replace-cluster", "replace-lost-nodes"] = "replace-lost-nodes"
    launch_at_notice: bool = Field(True, description="boot the doomed ranks' replacements during the notice")
    prewarm_on_rebalance: bool = Field(False, description="boot a standby on a rebalance recommendation")
    review_minutes: float = Field(
        30.0, ge=0, le=7 * 24 * 60,
        description="while training, ask placement this often whether a clearly better placement exists "
        "(leave on-demand for spot, a much cheaper pool, grow back to nodes); 0: never move voluntarily")
    prewarm_wait_s: float = Field(600.0, gt=0, le=3600, description="release the standby if no notice by then")
    spot_wait_minutes: float | None = Field(
        None, ge=0, le=7 * 24 * 60,
        description="with no training gang, wait (unbilled) up to this long for a spot pool instead of launching "
        "on on-demand or on a spot pool that does far less work per dollar; 0: launch the best candidate at once; "
        "unset: wait up to 120 minutes only while the job's own spot attempts paid per useful step against "
        "on-demand (placement/spot_evidence.py)")
    max_placing_minutes: float | None = Field(
        None, gt=0, le=30 * 24 * 60,
        description="fail the job (NoPlacementError) once it has had no training gang this long: waiting for "
        "spot, for a pool's cooldown, backing off after capacity errors; from its submission, or from its last "
        "attempt's end; unset: wait as long as it takes")
    max_slowdown: float | None = Field(
        None, ge=1, le=100, allow_inf_nan=False,
        description="finish within about this many times on-demand's wall time: h hours after its submission the "
        "job should have committed what its full gang trains on on-demand in h / max_slowdown hours; more than an "
        "hour behind, its next gang goes on on-demand, and it returns to spot once on schedule "
        "(placement/spot_evidence.py); unset: cost alone decides")
    max_recoveries: int | None = Field(
        None, ge=0, le=1_000_000,
        description="interruptions, node losses and infrastructure failures the job may recover from in its "
        "whole life; unset: no lifetime cap (a long job on spot meets hundreds; max_stalled_recoveries stops "
        "one that makes no progress)")
    max_stalled_recoveries: int = Field(
        10, ge=0, le=1000,
        description="recoveries in a row with no checkpoint committed newer than the job's newest one at the "
        "recovery before: a job that keeps losing its gangs before they save anything fails instead of "
        "relaunching for ever")
    max_user_restarts: int = Field(0, ge=0, le=100)
    retry_exit_codes: list[int] = Field(default_factory=list)

    @field_validator("retry_exit_codes")
    @classmethod
    def _codes(cls, values: list[int]) -> list[int]:
        for code in values:
            if not 1 <= code <= 255:
                raise ValueError(f"exit code {code} is outside 1..255")
        return values


class Tracking(Strict):
    mlflow_experiment: str | None = None
    tracking_uri: str | None = None
    tags: dict[str, str] = Field(default_factory=dict)
    register_model: str | None = Field(None, min_length=1, max_length=256,
                                       description="register the final checkpoint as a version of this MLflow model")


class Notifications(Strict):
    sns_topic_arn: str | None = Field(None, pattern=r"^arn:aws[a-z-]*:sns:[a-z0-9-]+:\d{12}:[\w-]+$")
    slack_channel: str | None = Field(None, pattern=r"^#?[a-z0-9_-]{1,80}$")


class Budget(Strict):
    max_total_cost: float | None = Field(None, gt=0, allow_inf_nan=False, description="USD for the whole job")
    warn_at: float | None = Field(0.8, gt=0, lt=1, description=(
        "share of max_total_cost at which the job's people are told once (SNS/Slack), before it stops; "
        "null: no warning"))


class Health(HealthPolicy, Strict):
    """The spec's ``health`` section: the agent's policy (contracts, which the agent may import) read with
    the spec's rule that a boolean is no number (``warmup_steps: yes`` was read as 1)."""


class JobSpec(Strict):
    """A training job: what to run, on what, how to checkpoint and recover it."""

    version: Literal[1]
    name: str = Field(..., pattern=NAME_RE)
    entrypoint: Entrypoint
    launcher: Launcher = Field(default_factory=Launcher)
    resources: Resources
    dataset: Dataset | None = None
    checkpoint: Checkpoint
    recovery: Recovery = Field(default_factory=Recovery)
    tracking: Tracking = Field(default_factory=Tracking)
    notifications: Notifications = Field(default_factory=Notifications)
    budget: Budget = Field(default_factory=Budget)
    health: Health = Field(default_factory=Health)
