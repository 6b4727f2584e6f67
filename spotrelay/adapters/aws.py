"""Cached boto3 clients, built on first use (cold starts pay only for what a handler touches)."""

from __future__ import annotations

import os
from functools import lru_cache
from typing import Any

import boto3
import botocore.session
from botocore.config import Config
from botocore.loaders import Loader, create_loader


def _config() -> Config:
    # the CLI asks for fewer attempts (SPOTRELAY_AWS_MAX_ATTEMPTS): a person waits for the answer
    attempts = int(os.environ.get("SPOTRELAY_AWS_MAX_ATTEMPTS") or 5)
    return Config(retries={"mode": "standard", "max_attempts": attempts}, connect_timeout=5, read_timeout=30)


@lru_cache(maxsize=1)
def _loader() -> Loader:
    """One botocore data loader for every session we open: each new session would otherwise parse
    the endpoint rules and the service models (megabytes of JSON, ~0.3 s a client) again. What it
    loads is only read, so sessions on other threads may share it."""
    return create_loader()


def _session() -> boto3.session.Session:
    core = botocore.session.get_session()
    core.register_component("data_loader", _loader())
    return boto3.session.Session(botocore_session=core)


@lru_cache(maxsize=64)
def client(service: str, region: str | None = None) -> Any:
    from spotrelay.settings import settings

    s = settings()
    return _session().client(  # type: ignore[call-overload]
        service, region_name=region or s.region, endpoint_url=s.endpoint_for(service), config=_config()
    )


@lru_cache(maxsize=8)
def resource(service: str, region: str | None = None) -> Any:
    from spotrelay.settings import settings

    s = settings()
    return _session().resource(  # type: ignore[call-overload]
        service, region_name=region or s.region, endpoint_url=s.endpoint_for(service), config=_config()
    )


def error_code(exc: Exception) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


def reset_clients() -> None:
    client.cache_clear()
    resource.cache_clear()
