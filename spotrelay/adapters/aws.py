"""Cached boto3 clients, built on first use (cold starts pay only for what a handler touches)."""

from __future__ import annotations

import os
from functools import lru_cache
from typing import Any

import boto3
from botocore.config import Config


def _config() -> Config:
    # the CLI asks for fewer attempts (SPOTRELAY_AWS_MAX_ATTEMPTS): a person waits for the answer
    attempts = int(os.environ.get("SPOTRELAY_AWS_MAX_ATTEMPTS") or 5)
    return Config(retries={"mode": "standard", "max_attempts": attempts}, connect_timeout=5, read_timeout=30)


@lru_cache(maxsize=64)
def client(service: str, region: str | None = None) -> Any:
    from spotrelay.settings import settings

    s = settings()
    return boto3.session.Session().client(  # type: ignore[call-overload]
        service, region_name=region or s.region, endpoint_url=s.endpoint_for(service), config=_config()
    )


@lru_cache(maxsize=8)
def resource(service: str, region: str | None = None) -> Any:
    from spotrelay.settings import settings

    s = settings()
    return boto3.session.Session().resource(  # type: ignore[call-overload]
        service, region_name=region or s.region, endpoint_url=s.endpoint_for(service), config=_config()
    )


def error_code(exc: Exception) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


def reset_clients() -> None:
    client.cache_clear()
    resource.cache_clear()
