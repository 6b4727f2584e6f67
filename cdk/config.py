"""The CDK app's settings, read from context (cdk.json or ``-c key=value``) and validated once.

Every key is documented in docs/deploy.md. Nothing here needs AWS credentials: the account stays a
deploy-time token, and AMIs come from SSM parameters that CloudFormation resolves at deploy time.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from spotrelay.errors import PermanentError

# The base Deep Learning AMI (NVIDIA driver, EFA, NCCL, aws-ofi-nccl); the agent installs the job's
# Python environment. Override with context key ``dlami_ssm_parameter``.
BUCKET_RE = r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$"  # an S3 bucket name
DEFAULT_DLAMI_PARAMETER = "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"


LOG_RETENTIONS = frozenset(
    {1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653}
)


class InfraConfigError(PermanentError):
    """The CDK context or a deploy input (the ASL, the handlers) cannot produce a valid app."""


CONTEXT_KEYS = (
    "prefix",
    "home_region",
    "training_regions",
    "instance_types",
    "fsx_enabled",
    "fsx_storage_gib",
    "slack_secret_name",
    "alarm_email",
    "dlami_ssm_parameter",
    "log_retention_days",
    "checkpoint_glacier_days",
    "reconcile_minutes",
    "vpc_cidrs",
    "availability_zones",
    "dataset_buckets",
)


class AppConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    prefix: str = Field(
        "spotrelay",
        pattern=r"^[a-z][a-z0-9-]{1,20}$",
        description="names tables, functions, buckets; two deployments need two prefixes",
    )
    home_region: str = Field("us-east-1", pattern=r"^[a-z]{2}(-gov)?-[a-z]+-\d$")
    training_regions: tuple[str, ...] = Field(
        ("us-east-1", "us-east-2", "us-west-2", "eu-west-1"), min_length=1, max_length=4
    )
    instance_types: tuple[str, ...] = Field(("p5.48xlarge", "p4d.24xlarge"), min_length=1)
    fsx_enabled: bool = False
    fsx_storage_gib: int = Field(1200, ge=1200, description="SCRATCH_2: 1200 or a multiple of 2400")
    slack_secret_name: str = "spotrelay/slack-webhook"
    alarm_email: str | None = None
    dlami_ssm_parameter: str = DEFAULT_DLAMI_PARAMETER
    log_retention_days: int = 30
    checkpoint_glacier_days: int = Field(30, ge=1)
    reconcile_minutes: int = Field(1, ge=1)
    vpc_cidrs: dict[str, str] = Field(default_factory=dict, description="region -> CIDR; default 10.42.0.0/16")
    # CDK cannot list a region's AZs offline; without this a training VPC spans the first two.
    availability_zones: dict[str, tuple[str, ...]] = Field(
        default_factory=dict, description="region -> AZ names for the training VPC (up to 6)"
    )
    # a team's datasets stay where they are: the nodes may read these buckets (each job only its
    # spec's dataset.uri and replicas), as well as the data buckets' data/
    dataset_buckets: tuple[Annotated[str, Field(pattern=BUCKET_RE)], ...] = ()

    @field_validator("training_regions", "instance_types", "dataset_buckets", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        # ``-c training_regions=us-east-1,eu-west-1`` arrives as one string
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                return tuple(json.loads(text))
            return tuple(part.strip() for part in text.split(",") if part.strip())
        return value

    @field_validator("fsx_enabled", mode="before")
    @classmethod
    def _bool(cls, value: Any) -> Any:
        if isinstance(value, str):
            return value.strip().lower() in ("1", "true", "yes", "on")
        return value

    @model_validator(mode="after")
    def _check(self) -> AppConfig:
        if len(set(self.training_regions)) != len(self.training_regions):
            raise ValueError("training_regions has duplicates")
        for region, zones in self.availability_zones.items():
            if not zones or len(zones) > 6 or not all(z.startswith(region) for z in zones):
                raise ValueError(f"availability_zones[{region}] must list 1-6 AZs of {region}")
        if self.log_retention_days not in LOG_RETENTIONS:
            raise ValueError(f"log_retention_days must be one of {sorted(LOG_RETENTIONS)}")
        if self.fsx_storage_gib != 1200 and self.fsx_storage_gib % 2400:
            raise ValueError("fsx_storage_gib must be 1200 or a multiple of 2400")
        return self

    def resource_name(self, suffix: str) -> str:
        return f"{self.prefix}-{suffix}"

    def vpc_cidr(self, region: str) -> str:
        return self.vpc_cidrs.get(region, "10.42.0.0/16")


def from_context(get: Any) -> AppConfig:
    """Build the config from a ``node.try_get_context``-like callable; unknown keys are ignored."""
    values = {key: get(key) for key in CONTEXT_KEYS}
    values = {key: value for key, value in values.items() if value is not None and value != ""}
    for key in ("vpc_cidrs", "availability_zones"):
        if isinstance(values.get(key), str):
            values[key] = json.loads(values[key])
    try:
        return AppConfig(**values)
    except ValueError as exc:
        raise InfraConfigError(f"invalid CDK context: {exc}") from exc
