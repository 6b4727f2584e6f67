"""Settings read from the environment on first use, never at import time."""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache

from spotrelay.resources import IDEMPOTENCY, JOBS, NODES, POOLS, RESOURCES


@dataclass(frozen=True)
class Settings:
    region: str
    endpoint_url: str | None  # moto's server locally; None on AWS
    jobs_table: str
    nodes_table: str
    pools_table: str
    idempotency_table: str
    bucket: str
    topic_arn: str | None
    state_machine_arn: str | None
    event_bus: str
    slack_secret_arn: str | None
    # botocore's own per-service override: the twin routes the nodes' S3 through a throttle
    s3_endpoint_url: str | None = None
    # where a job's checkpoint.s3_prefix may point: what the agent roles' boundary lets a node write
    # (the CDK app sets the jobs and data buckets' checkpoints/; default: the jobs bucket's)
    checkpoint_roots: tuple[str, ...] = ()
    # where a job's dataset.uri and replicas may point (the data buckets' data/ and the deployment's
    # dataset_buckets); none set: not checked (the twin enforces no IAM)
    dataset_roots: tuple[str, ...] = ()
    # whether the training regions have FSx for Lustre (the deployment's fsx_enabled); None: unknown,
    # not checked (the twin)
    fsx_enabled: bool | None = None

    def endpoint_for(self, service: str) -> str | None:
        return (self.s3_endpoint_url if service == "s3" else None) or self.endpoint_url


def _env(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(name)
    return value if value else default


def _listed(name: str) -> tuple[str, ...]:
    return tuple(r.strip() for r in (_env(name) or "").split(",") if r.strip())


def _flag(name: str) -> bool | None:
    value = _env(name)
    return None if value is None else value.strip().lower() == "true"


def _roots(bucket: str) -> tuple[str, ...]:
    return _listed(RESOURCES.checkpoint_roots_env) or (f"s3://{bucket}/{RESOURCES.checkpoints_prefix}",)


@lru_cache(maxsize=1)
def settings() -> Settings:
    r = RESOURCES
    bucket = _env(r.bucket_env, r.bucket_default) or r.bucket_default
    return Settings(
        region=_env("AWS_REGION", _env("AWS_DEFAULT_REGION", "us-east-1")) or "us-east-1",
        endpoint_url=_env("AWS_ENDPOINT_URL"),
        jobs_table=_env(JOBS.env, JOBS.default_name) or JOBS.default_name,
        nodes_table=_env(NODES.env, NODES.default_name) or NODES.default_name,
        pools_table=_env(POOLS.env, POOLS.default_name) or POOLS.default_name,
        idempotency_table=_env(IDEMPOTENCY.env, IDEMPOTENCY.default_name) or IDEMPOTENCY.default_name,
        bucket=bucket,
        topic_arn=_env(r.topic_env),
        state_machine_arn=_env(r.state_machine_env),
        event_bus=_env(r.event_bus_env, "default") or "default",
        slack_secret_arn=_env(r.slack_secret_env),
        s3_endpoint_url=_env("AWS_ENDPOINT_URL_S3"),
        checkpoint_roots=_roots(bucket),
        dataset_roots=_listed(RESOURCES.dataset_roots_env),
        fsx_enabled=_flag(RESOURCES.fsx_env),
    )


def reset() -> None:
    """Forget cached settings and clients (tests and the twin change the environment)."""
    settings.cache_clear()
    from spotrelay.adapters import aws

    aws.reset_clients()
