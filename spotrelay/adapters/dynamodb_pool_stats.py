"""PoolStatsStore on DynamoDB (the PoolStats table of ``spotrelay/resources.py``, key ``pool_key``).

Concurrent handlers record events for the same pool (four interruption notices of one gang arrive
together), so nothing is read-modified-written: counters move with atomic ``ADD``, and the
cooldown is only ever extended, by a conditional ``SET`` that loses quietly to a later deadline
already stored. How long an event cools a pool is decided by the pure ``cooldown_seconds``. A notice
counts as an interruption only when it begins a reclaim wave (``cooldown.new_wave``): the count and
the wave's start move in one conditional update, so of a wave's notices arriving together exactly
one wins it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from botocore.exceptions import ClientError

from spotrelay.adapters.aws import client, error_code
from spotrelay.placement.cooldown import CooldownPolicy, PoolEvent, cooldown_seconds
from spotrelay.placement.pool_stats import PoolStats
from spotrelay.settings import settings

_INTS = ("launches", "interruptions", "capacity_failures", "quota_failures", "failure_streak")
_FLOATS = ("hours_observed", "cooldown_until", "last_event_at", "wave_at")
_COUNTER = {
    PoolEvent.LAUNCHED: "launches", PoolEvent.INTERRUPTED: "interruptions",
    PoolEvent.CAPACITY_FAILURE: "capacity_failures", PoolEvent.QUOTA_EXCEEDED: "quota_failures",
}


def _num(value: float) -> dict[str, str]:
    return {"N": repr(float(value)) if isinstance(value, float) else str(value)}


def _stats(item: dict[str, Any]) -> PoolStats:
    fields: dict[str, Any] = {"pool_key": item["pool_key"]["S"]}
    for name in _INTS:
        if name in item:
            fields[name] = int(float(item[name]["N"]))
    for name in _FLOATS:
        if name in item:
            fields[name] = float(item[name]["N"])
    if "last_event" in item:
        fields["last_event"] = item["last_event"]["S"]
    return PoolStats(**fields)


class DynamoDBPoolStatsStore:
    def __init__(self, table: str | None = None, policy: CooldownPolicy | None = None,
                 client_factory: Callable[..., Any] = client) -> None:
        self._table = table or settings().pools_table
        self._policy = policy or CooldownPolicy()
        self._client = client_factory

    @property
    def _ddb(self) -> Any:
        return self._client("dynamodb")

    def get_many(self, pool_keys: Iterable[str]) -> dict[str, PoolStats]:
        keys = sorted(set(pool_keys))
        out: dict[str, PoolStats] = {}
        for start in range(0, len(keys), 100):  # BatchGetItem takes 100 keys
            request: dict[str, Any] = {self._table: {
                "Keys": [{"pool_key": {"S": k}} for k in keys[start:start + 100]], "ConsistentRead": True}}
            while request:
                answer = self._ddb.batch_get_item(RequestItems=request)
                for item in answer.get("Responses", {}).get(self._table, []):
                    stats = _stats(item)
                    out[stats.pool_key] = stats
                request = answer.get("UnprocessedKeys") or {}
        return out

    def all(self) -> dict[str, PoolStats]:
        out: dict[str, PoolStats] = {}
        for page in self._ddb.get_paginator("scan").paginate(TableName=self._table):
            for item in page.get("Items", []):
                stats = _stats(item)
                out[stats.pool_key] = stats
        return out

    def record(self, pool_key: str, event: PoolEvent, now: float, hours: float = 0.0) -> PoolStats:
        if event is PoolEvent.OBSERVED and hours < 0:
            raise ValueError("hours observed cannot be negative")
        stats = self._interrupted(pool_key, now) if event is PoolEvent.INTERRUPTED else self._count(
            pool_key, event, now, hours)
        seconds = cooldown_seconds(stats, event, self._policy)
        return self._extend_cooldown(stats, now + seconds) if seconds > 0 else stats

    def _count(self, pool_key: str, event: PoolEvent, now: float, hours: float) -> PoolStats:
        """Move the event's counters (``ADD``) and its last-event fields in one update."""
        adds = {"hours_observed": float(hours)} if event is PoolEvent.OBSERVED else {_COUNTER[event]: 1}
        sets: dict[str, Any] = {}
        if event is not PoolEvent.OBSERVED:
            sets = {"last_event": {"S": event.value}, "last_event_at": _num(float(now))}
        if event is PoolEvent.CAPACITY_FAILURE:
            adds["failure_streak"] = 1
        elif event is PoolEvent.LAUNCHED:
            sets["failure_streak"] = {"N": "0"}
        names = {f"#{k}": k for k in (*adds, *sets)}
        values = {f":{k}": _num(v) for k, v in adds.items()} | {f":{k}": v for k, v in sets.items()}
        expression = "ADD " + ", ".join(f"#{k} :{k}" for k in adds)
        if sets:
            expression += " SET " + ", ".join(f"#{k} = :{k}" for k in sets)
        answer = self._ddb.update_item(
            TableName=self._table, Key={"pool_key": {"S": pool_key}}, UpdateExpression=expression,
            ExpressionAttributeNames=names, ExpressionAttributeValues=values, ReturnValues="ALL_NEW",
        )
        return _stats(answer["Attributes"])

    def _interrupted(self, pool_key: str, now: float) -> PoolStats:
        """Count the notice if it begins a wave (no counted one within ``wave_s`` of it), else only note it."""
        names = {"#le": "last_event", "#at": "last_event_at"}
        values = {":le": {"S": PoolEvent.INTERRUPTED.value}, ":at": _num(float(now))}
        key = {"pool_key": {"S": pool_key}}
        try:
            answer = self._ddb.update_item(
                TableName=self._table, Key=key, UpdateExpression="ADD #n :one SET #le = :le, #at = :at, #w = :at",
                ConditionExpression="attribute_not_exists(#w) OR #w <= :lo OR #w >= :hi",
                ExpressionAttributeNames=names | {"#n": "interruptions", "#w": "wave_at"},
                ExpressionAttributeValues=values | {":one": _num(1), ":lo": _num(now - self._policy.wave_s),
                                                    ":hi": _num(now + self._policy.wave_s)},
                ReturnValues="ALL_NEW")
        except ClientError as exc:
            if error_code(exc) != "ConditionalCheckFailedException":
                raise
            answer = self._ddb.update_item(  # a notice of the wave already counted
                TableName=self._table, Key=key, UpdateExpression="SET #le = :le, #at = :at",
                ExpressionAttributeNames=names, ExpressionAttributeValues=values, ReturnValues="ALL_NEW")
        return _stats(answer["Attributes"])

    def _extend_cooldown(self, stats: PoolStats, until: float) -> PoolStats:
        try:
            answer = self._ddb.update_item(
                TableName=self._table, Key={"pool_key": {"S": stats.pool_key}},
                UpdateExpression="SET cooldown_until = :u",
                ConditionExpression="attribute_not_exists(cooldown_until) OR cooldown_until < :u",
                ExpressionAttributeValues={":u": _num(until)}, ReturnValues="ALL_NEW",
            )
        except ClientError as exc:
            if error_code(exc) != "ConditionalCheckFailedException":
                raise
            return stats  # a later cooldown is already stored; keep it
        return _stats(answer["Attributes"])
