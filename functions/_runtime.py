"""Shared Lambda runtime: one Powertools Logger, lazily built adapters, idempotency.

Nothing here creates a client at import time. Each factory builds its adapter on first use and
caches it. The local twin and the tests swap adapters in-process with :func:`set_factories`; no
environment variable can make a production function import a module it names.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools import Logger

if TYPE_CHECKING:  # cold start: boto3 (via Powertools idempotency) and the ports load on first use
    from aws_lambda_powertools.utilities.idempotency import DynamoDBPersistenceLayer

    from spotrelay.ports.compute import Compute
    from spotrelay.ports.job_store import JobStore
    from spotrelay.ports.market import MarketData
    from spotrelay.ports.notifier import Notifier
    from spotrelay.ports.object_store import ObjectStore
    from spotrelay.ports.workflow import Workflow

logger = Logger(service="spotrelay")

Factory = Callable[[], Any]
_overrides: dict[str, Factory] = {}
_cache: dict[str, Any] = {}
_per_thread = threading.local()
_generation = [0]  # bumped by reset(): each thread's idempotency layer is rebuilt on its next use


def set_factories(**factories: Factory | None) -> None:
    """Replace adapters (``compute=``, ``market=``, ``pool_stats=``, ``notifier=``, ``store=``,
    ``workflow=``, ``objects=``, ``metrics=``); ``None`` restores the default. Clears cached instances."""
    for name, factory in factories.items():
        if factory is None:
            _overrides.pop(name, None)
        else:
            _overrides[name] = factory
    reset()


def reset() -> None:
    """Forget built adapters (after the environment or the factories changed)."""
    _cache.clear()
    _generation[0] += 1


def _build(name: str, default: Factory) -> Any:
    if name not in _cache:
        factory = _overrides.get(name) or default
        _cache[name] = factory()
    return _cache[name]


def _default_store() -> JobStore:
    from spotrelay.adapters.dynamodb_job_store import DynamoDBJobStore

    return DynamoDBJobStore()


def _default_workflow() -> Workflow:
    from spotrelay.adapters.sfn_workflow import SfnWorkflow

    return SfnWorkflow()


def _default_compute() -> Compute:
    from spotrelay.adapters.ec2_compute import Ec2Compute, Ec2ComputeConfig

    # AMIs, subnets, security groups and the instance profile come from the stack as JSON
    raw = os.environ.get("SPOTRELAY_EC2_CONFIG", "")
    return Ec2Compute(Ec2ComputeConfig.model_validate_json(raw) if raw else None)


def _default_market() -> MarketData:
    from spotrelay.adapters.ec2_market import Ec2MarketData

    return Ec2MarketData()


def _default_pool_stats() -> Any:
    from spotrelay.adapters.dynamodb_pool_stats import DynamoDBPoolStatsStore

    return DynamoDBPoolStatsStore()


def _default_objects() -> ObjectStore:
    from spotrelay.adapters.s3_object_store import S3ObjectStore

    return S3ObjectStore()


def _default_notifier() -> Notifier:
    from spotrelay.adapters.sns_notifier import SnsNotifier

    return SnsNotifier()


def store() -> JobStore:
    return _build("store", _default_store)


def workflow() -> Workflow:
    return _build("workflow", _default_workflow)


def compute() -> Compute:
    return _build("compute", _default_compute)


def market() -> MarketData:
    return _build("market", _default_market)


def pool_stats() -> Any:
    return _build("pool_stats", _default_pool_stats)


def notifier() -> Notifier:
    return _build("notifier", _default_notifier)


def objects() -> ObjectStore:
    return _build("objects", _default_objects)


# --- idempotency -------------------------------------------------------------------------------
def reconcile_s() -> float:
    """The reconcile schedule's period (``SPOTRELAY_RECONCILE_S``, set by cdk/functions.py from
    ``reconcile_minutes``): a budget's stop comes a sweep and a save ahead of it."""
    from spotrelay.domain.cost import SWEEP_S

    return float(os.environ.get("SPOTRELAY_RECONCILE_S") or SWEEP_S)


def _persistence() -> DynamoDBPersistenceLayer:
    """One layer per thread: Powertools keeps the running function's name on the layer (its key
    prefix, set by every call), so two handlers sharing one at the same time (the twin serves its
    queues from threads of one process) saved a record under one name and completed it under the
    other; the first stayed IN_PROGRESS and every redelivery of that event failed until dropped."""
    layer: DynamoDBPersistenceLayer | None = getattr(_per_thread, "layer", None)
    if layer is None or getattr(_per_thread, "generation", None) != _generation[0]:
        from aws_lambda_powertools.utilities.idempotency import DynamoDBPersistenceLayer

        from spotrelay.adapters.aws import client
        from spotrelay.settings import settings

        layer = DynamoDBPersistenceLayer(table_name=settings().idempotency_table, boto3_client=client("dynamodb"))
        _per_thread.layer, _per_thread.generation = layer, _generation[0]
    return layer


def once(name: str, key: dict[str, Any], action: Callable[[], dict[str, Any]], context: Any = None,
         expires_after_s: int = 24 * 3600) -> dict[str, Any]:
    """Run ``action`` at most once per ``(name, key)`` (DESIGN.md section 3 dedupe keys).

    A repeat returns the first result; a failed run leaves no record, so a redelivery retries.
    """
    from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig, idempotent_function

    config = IdempotencyConfig(expires_after_seconds=expires_after_s, raise_on_no_idempotency_key=True)
    if context is not None:
        config.register_lambda_context(context)

    def run(key: dict[str, Any]) -> dict[str, Any]:
        return action()

    run.__qualname__ = run.__name__ = name  # the record id is "<function>.<name>#<hash of key>"
    guarded = idempotent_function(data_keyword_argument="key", persistence_store=_persistence(), config=config)(run)
    result: dict[str, Any] = guarded(key=key)
    return result


def metrics() -> Any:
    """Operator metrics (EMF lines on stdout; None when a test or the twin turned them off)."""

    def default() -> Any:
        from spotrelay.adapters.emf_metrics import EmfMetrics

        return EmfMetrics()

    return _build("metrics", default)


def controller() -> Any:
    """The ports bundled for the services (spotrelay.services.controller.Controller)."""
    from spotrelay.services.controller import Controller

    return Controller(store=store(), workflow=workflow(), compute=_lazy("compute", compute),
                      market=_lazy("market", market), pool_stats=_lazy("pool_stats", pool_stats),
                      notifier=_optional_notifier(), objects=_lazy("objects", objects),
                      metrics=metrics())


class _Lazy:
    """Builds the adapter on first attribute access: a handler that never launches pays nothing."""

    def __init__(self, factory: Callable[[], Any]) -> None:
        self._factory = factory

    def __getattr__(self, name: str) -> Any:
        return getattr(self._factory(), name)


def _lazy(name: str, factory: Callable[[], Any]) -> Any:
    return _cache[name] if name in _cache else _Lazy(factory)


def _optional_notifier() -> Notifier | None:
    from spotrelay.settings import settings

    if "notifier" not in _overrides and not settings().topic_arn:
        return None
    return _lazy("notifier", notifier)
