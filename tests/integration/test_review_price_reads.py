"""The placement review's price reads against EC2 (botocore's Stubber: moto never throttles): a poll
whose price history EC2 refuses stays and keeps the last mark (a catalog price is not a reading, so a
throttled region does not look like a price move and bring a full review each time it fails and
recovers), and a full review brought forward by a price move reads the prices the poll just read, not
again. The Stubber answers only the calls queued for it and fails on any other, so each step below
also says which EC2 calls it made."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime

import boto3
import pytest
from botocore.stub import ANY, Stubber

from spotrelay.adapters.ec2_market import PRICE_TTL_S, Ec2MarketData
from spotrelay.adapters.memory_job_store import MemoryJobStore
from spotrelay.contracts.recovery import AttemptEnd, Verdict
from spotrelay.contracts.workflow import WorkflowTimings
from spotrelay.placement import InMemoryPoolStatsStore
from spotrelay.services import review
from spotrelay.services.controller import Controller
from tests.integration.controller_doubles import ScriptedCompute, running_job

TYPES = ["p5.48xlarge", "p4d.24xlarge"]  # controller_doubles.spec's
ASK = {"InstanceTypes": TYPES, "ProductDescriptions": ["Linux/UNIX"], "StartTime": ANY}
TIMINGS = WorkflowTimings(heartbeat_s=10**6)  # (the gang's records are not refreshed here: never silent)


def _history(p5: str) -> dict[str, object]:
    stamp = datetime(2026, 12, 1, tzinfo=UTC)
    return {"SpotPriceHistory": [
        {"AvailabilityZone": "us-east-1a", "InstanceType": "p5.48xlarge", "SpotPrice": p5, "Timestamp": stamp},
        {"AvailabilityZone": "us-east-1b", "InstanceType": "p4d.24xlarge", "SpotPrice": "9.10", "Timestamp": stamp}]}


@pytest.fixture
def reviewed() -> Iterator[tuple[Controller, Stubber, list[float]]]:
    ec2 = boto3.client("ec2", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x",
                       endpoint_url="https://ec2.us-east-1.amazonaws.com")
    clock = [1_000_000.0]
    market = Ec2MarketData(client_factory=lambda service, region=None: ec2, clock=lambda: clock[0],
                           placement_scores=False)
    store, compute = MemoryJobStore(), ScriptedCompute()
    running_job(store, compute)
    with Stubber(ec2) as stub:
        yield Controller(store=store, compute=compute, market=market, pool_stats=InMemoryPoolStatsStore()), stub, clock
        stub.assert_no_pending_responses()


def test_a_throttled_poll_keeps_the_mark_and_a_move_is_read_once(
        reviewed: tuple[Controller, Stubber, list[float]]) -> None:
    ctl, stub, clock = reviewed
    now = time.time()

    def step(mark: str | None, backoff: object, at: float) -> AttemptEnd:
        clock[0] += PRICE_TTL_S + 1  # each review comes after the last read expired
        out = review.review(ctl, "job-under-test", 1, at, TIMINGS, review_mark=mark, review_backoff=backoff)
        assert out.outcome is Verdict.READY
        return out

    stub.add_response("describe_spot_price_history", _history("24.50"), ASK)
    first = step(None, None, now)  # the attempt's first review: a full one
    assert first.reason == "no better placement" and first.review_mark is not None
    mark, backoff = first.review_mark, first.review_backoff
    assert backoff is not None and backoff.due > now + 60

    stub.add_client_error("describe_spot_price_history", "RequestLimitExceeded", "slow down", expected_params=ASK)
    throttled = step(mark, backoff, now + 30)  # the catalog's prices: no reading, nothing moved
    assert throttled.reason == "prices hold; the full review is not due"
    assert (throttled.review_mark, throttled.review_backoff) == (mark, backoff)

    stub.add_response("describe_spot_price_history", _history("24.50"), ASK)
    again = step(mark, backoff, now + 60)  # read again, as the last full review read them: a poll
    assert again.reason == "prices hold; the full review is not due" and again.review_mark == mark

    stub.add_response("describe_spot_price_history", _history("12.00"), ASK)  # one read only: the Stubber
    moved = step(mark, backoff, now + 90)  # fails a second one; the move brings the full review forward
    assert moved.reason == "no better placement" and moved.review_mark not in (None, mark)
    assert moved.review_backoff is not None and moved.review_backoff.gap_s == backoff.gap_s  # kept, not doubled


def test_a_price_read_serves_the_calls_within_its_ttl_and_a_failure_is_not_kept(
        reviewed: tuple[Controller, Stubber, list[float]]) -> None:
    ctl, stub, clock = reviewed
    market = ctl.market
    assert market is not None
    stub.add_client_error("describe_spot_price_history", "RequestLimitExceeded", "slow down", expected_params=ASK)
    refused = market.quotes(["us-east-1"], TYPES, ["spot", "on-demand"])
    assert {q.fallback for q in refused if q.pool.market == "spot"} == {True}
    assert {q.fallback for q in refused if q.pool.market == "on-demand"} == {False}  # (the catalog's own price)
    stub.add_response("describe_spot_price_history", _history("24.50"), ASK)  # asked again at once
    read = market.quotes(["us-east-1"], TYPES, ["spot"])
    assert [(q.pool.az, q.price_per_hour, q.fallback) for q in read] == [("us-east-1a", 24.5, False),
                                                                        ("us-east-1b", 9.1, False)]
    clock[0] += PRICE_TTL_S - 1
    assert market.quotes(["us-east-1"], TYPES, ["spot"], capacity=16) == read  # no call queued: none made
    clock[0] += 2
    stub.add_response("describe_spot_price_history", _history("30.00"), ASK)
    assert market.quotes(["us-east-1"], TYPES, ["spot"])[0].price_per_hour == 30.0


@pytest.mark.parametrize("garbled", [
    {"AvailabilityZone": "us-east-1a", "InstanceType": "p5.48xlarge", "Timestamp": datetime(2026, 12, 1, tzinfo=UTC)},
    {"AvailabilityZone": "us-east-1a", "InstanceType": "p5.48xlarge", "SpotPrice": "NaN"},
    {"AvailabilityZone": "us-east-1a", "InstanceType": "p5.48xlarge", "SpotPrice": "0",
     "Timestamp": datetime(2026, 12, 1, tzinfo=UTC)},
    {"InstanceType": "p5.48xlarge", "SpotPrice": "abc", "Timestamp": datetime(2026, 12, 1, tzinfo=UTC)},
], ids=["no-price", "nan-no-stamp", "zero", "no-zone"])
def test_a_malformed_price_answer_is_read_as_the_catalog_and_kept_off_the_mark(
        reviewed: tuple[Controller, Stubber, list[float]], garbled: dict[str, object]) -> None:
    ctl, stub, _ = reviewed
    market = ctl.market
    assert market is not None
    good = _history("24.50")["SpotPriceHistory"]
    assert isinstance(good, list)
    stub.add_response("describe_spot_price_history", {"SpotPriceHistory": [*good, garbled]}, ASK)
    quotes = market.quotes(["us-east-1"], TYPES, ["spot"])
    assert quotes and {q.fallback for q in quotes} == {True}  # the catalog's, marked: no reading
    assert review.reading_mark(quotes) is None
    stub.add_response("describe_spot_price_history", _history("24.50"), ASK)  # not kept: asked again at once
    assert [q.fallback for q in market.quotes(["us-east-1"], TYPES, ["spot"])] == [False, False]
