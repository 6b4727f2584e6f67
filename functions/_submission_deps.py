"""Lazily built adapters for on_submission (no clients at import time)."""

from __future__ import annotations

from functools import lru_cache

from spotrelay.adapters.dynamodb_job_store import DynamoDBJobStore
from spotrelay.adapters.s3_object_store import S3ObjectStore
from spotrelay.adapters.sfn_workflow import SfnWorkflow
from spotrelay.ports.notifier import Notifier
from spotrelay.settings import settings


@lru_cache(maxsize=1)
def store() -> DynamoDBJobStore:
    return DynamoDBJobStore()


@lru_cache(maxsize=1)
def objects() -> S3ObjectStore:
    return S3ObjectStore()


@lru_cache(maxsize=1)
def workflow() -> SfnWorkflow:
    return SfnWorkflow()


def notifier() -> Notifier | None:
    if not settings().topic_arn:
        return None
    try:
        from spotrelay.adapters.sns_notifier import SnsNotifier  # written with the controller
    except ImportError:
        return None
    return SnsNotifier()


def reset() -> None:
    for factory in (store, objects, workflow):
        factory.cache_clear()
