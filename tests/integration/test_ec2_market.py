"""EC2 market adapter: newest spot price per AZ, placement scores by zone ID, catalog fallback."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import boto3
import pytest
from botocore.stub import ANY, Stubber

from spotrelay.adapters.ec2_market import Ec2MarketData
from spotrelay.placement import catalog, rank_pools
from spotrelay.spec.models import JobSpec

NOW = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)


@pytest.fixture
def stubbed() -> Iterator[tuple[Ec2MarketData, Stubber]]:
    ec2 = boto3.client("ec2", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x",
                       endpoint_url="https://ec2.us-east-1.amazonaws.com")
    with Stubber(ec2) as stub:
        yield Ec2MarketData(client_factory=lambda service, region=None: ec2, clock=NOW.timestamp), stub
        stub.assert_no_pending_responses()


def price(az: str, itype: str, usd: str, minute: int) -> dict[str, object]:
    return {"AvailabilityZone": az, "InstanceType": itype, "ProductDescription": "Linux/UNIX",
            "SpotPrice": usd, "Timestamp": datetime(2026, 11, 30, 2, minute, tzinfo=UTC)}


def test_newest_price_per_az_and_scores_by_zone_name(stubbed: tuple[Ec2MarketData, Stubber]) -> None:
    market, stub = stubbed
    stub.add_response("get_spot_placement_scores", {"SpotPlacementScores": [
        {"Region": "us-east-1", "AvailabilityZoneId": "use1-az6", "Score": 9},
        {"Region": "us-east-1", "AvailabilityZoneId": "use1-az9", "Score": 2},  # a zone we do not map
    ]}, {"InstanceTypes": ["p5.48xlarge"], "TargetCapacity": 1, "TargetCapacityUnitType": "units",
         "SingleAvailabilityZone": True, "RegionNames": ["us-east-1"]})
    stub.add_response("describe_availability_zones", {"AvailabilityZones": [
        {"ZoneId": "use1-az6", "ZoneName": "us-east-1a", "RegionName": "us-east-1"}]})
    stub.add_client_error("get_spot_placement_scores", "UnauthorizedOperation", "no permission")
    stub.add_response("describe_spot_price_history", {"SpotPriceHistory": [
        price("us-east-1a", "p5.48xlarge", "30.00", 10),
        price("us-east-1a", "p5.48xlarge", "24.50", 50),  # newest wins
        price("us-east-1a", "p5.48xlarge", "27.00", 30),
        price("us-east-1b", "p4d.24xlarge", "9.10", 20),
    ]}, {"InstanceTypes": ["p5.48xlarge", "p4d.24xlarge"], "ProductDescriptions": ["Linux/UNIX"], "StartTime": ANY})
    quotes = market.quotes(["us-east-1"], ["p5.48xlarge", "p4d.24xlarge"], ["spot", "on-demand"])
    got = {q.pool.key: (q.price_per_hour, q.advisor_band, q.placement_score) for q in quotes}
    assert got == {
        "us-east-1/us-east-1a/p5.48xlarge/spot": (24.5, catalog.advisor_band("us-east-1", "p5.48xlarge"), 9.0),
        "us-east-1/us-east-1a/p5.48xlarge/on-demand": (55.04, None, None),
        "us-east-1/us-east-1b/p4d.24xlarge/spot": (9.1, catalog.advisor_band("us-east-1", "p4d.24xlarge"), None),
        "us-east-1/us-east-1b/p4d.24xlarge/on-demand": (21.96, None, None),
    }


def test_a_poll_reads_the_prices_without_asking_for_placement_scores(stubbed: tuple[Ec2MarketData, Stubber]) -> None:
    """A placement review's poll (``scores=False``) asks DescribeSpotPriceHistory only: the Stubber fails
    on any call it was not given, GetSpotPlacementScores included."""
    market, stub = stubbed
    stub.add_response("describe_spot_price_history", {"SpotPriceHistory": [price("us-east-1a", "p5.48xlarge", "24.50",
                                                                                 50)]},
                      {"InstanceTypes": ["p5.48xlarge"], "ProductDescriptions": ["Linux/UNIX"], "StartTime": ANY})
    quotes = market.quotes(["us-east-1"], ["p5.48xlarge"], ["spot"], capacity=16, scores=False)
    assert [(q.pool.key, q.price_per_hour, q.placement_score) for q in quotes] == [
        ("us-east-1/us-east-1a/p5.48xlarge/spot", 24.5, None)]


def test_a_region_without_price_history_falls_back_to_the_catalog(stubbed: tuple[Ec2MarketData, Stubber]) -> None:
    market, stub = stubbed
    stub.add_client_error("describe_spot_price_history", "RequestLimitExceeded", "slow down")
    quotes = Ec2MarketData(client_factory=market._client, placement_scores=False).quotes(
        ["us-east-1"], ["p4d.24xlarge"], ["spot"])
    assert {q.pool.az for q in quotes} == set(catalog.zones("us-east-1", "p4d.24xlarge"))
    assert {q.price_per_hour for q in quotes} == {catalog.typical_spot_price("us-east-1", "p4d.24xlarge")}
    assert all(q.fallback for q in quotes)  # not a reading (a review's price mark leaves it out)


def test_against_moto_prices_feed_placement(aws: dict[str, str]) -> None:
    market = Ec2MarketData(placement_scores=False)  # moto has no GetSpotPlacementScores
    quotes = market.quotes(["us-east-1", "us-west-2"], ["p5.48xlarge"], ["spot", "on-demand"])
    regions = {q.pool.region for q in quotes}
    assert regions == {"us-east-1", "us-west-2"}
    assert {q.pool.market for q in quotes} == {"spot", "on-demand"}
    spec = JobSpec.model_validate({
        "version": 1, "name": "x", "entrypoint": {"command": ["true"]}, "checkpoint": {"every_steps": 10},
        "resources": {"nodes": 2, "regions": ["us-east-1", "us-west-2"], "instance_types": ["p5.48xlarge"]},
    })
    assert rank_pools(spec, quotes, {}, NOW.timestamp())[0].pool.market == "spot"  # moto's spot is ~free


def test_placement_scores_are_sized_for_the_gang_and_fall_back_when_refused(
        stubbed: tuple[Ec2MarketData, Stubber]) -> None:
    market, stub = stubbed
    ask = {"InstanceTypes": ["p5.48xlarge"], "TargetCapacityUnitType": "units", "SingleAvailabilityZone": True,
           "RegionNames": ["us-east-1"]}
    history = {"SpotPriceHistory": [price("us-east-1a", "p5.48xlarge", "24.5", 50)]}
    stub.add_response("get_spot_placement_scores", {"SpotPlacementScores": [
        {"Region": "us-east-1", "AvailabilityZoneId": "use1-az6", "Score": 3}]}, {**ask, "TargetCapacity": 17})
    stub.add_response("describe_availability_zones", {"AvailabilityZones": [
        {"ZoneId": "use1-az6", "ZoneName": "us-east-1a", "RegionName": "us-east-1"}]})
    stub.add_response("describe_spot_price_history", history, {
        "InstanceTypes": ["p5.48xlarge"], "ProductDescriptions": ["Linux/UNIX"], "StartTime": ANY})
    quotes = market.quotes(["us-east-1"], ["p5.48xlarge"], ["spot"], capacity=17)
    assert [q.placement_score for q in quotes] == [3.0]  # what the API said for 17 instances
    # an account whose recent spot usage is below the gang: AWS refuses the size; ask for one instance
    stub.add_client_error("get_spot_placement_scores", "InvalidParameterValue", "target capacity exceeds your limit",
                          expected_params={**ask, "TargetCapacity": 64})
    stub.add_response("get_spot_placement_scores", {"SpotPlacementScores": [
        {"Region": "us-east-1", "AvailabilityZoneId": "use1-az6", "Score": 8}]}, {**ask, "TargetCapacity": 1})
    # (the zone names asked above and the prices read a moment ago serve this call: no second
    # DescribeAvailabilityZones, which never changes, nor DescribeSpotPriceHistory, PRICE_TTL_S)
    assert [q.placement_score for q in market.quotes(["us-east-1"], ["p5.48xlarge"], ["spot"], capacity=64)] == [8.0]


SPOT_A = catalog.pools(["us-east-1"], ["p5.48xlarge"], ["spot"])[0]


def test_price_history_asks_for_the_pools_zone_and_type_over_the_attempt(
        stubbed: tuple[Ec2MarketData, Stubber]) -> None:
    """What the ledger prices a closed attempt at (AWS bills the price in effect): the pool's changes from
    the attempt's start (AWS answers with the one in effect then too) to its close, oldest first; another
    zone's or type's entries are not this pool's."""
    market, stub = stubbed
    start, end = datetime(2026, 11, 30, 2, 0, tzinfo=UTC), datetime(2026, 11, 30, 3, 0, tzinfo=UTC)
    stub.add_response("describe_spot_price_history", {"SpotPriceHistory": [
        price(SPOT_A.az, "p5.48xlarge", "31.00", 40),
        price(SPOT_A.az, "p5.48xlarge", "24.00", 0),
        price("us-east-1z", "p5.48xlarge", "99.00", 20),  # (a filter AWS applies; an adapter must not trust it)
    ]}, {"InstanceTypes": ["p5.48xlarge"], "ProductDescriptions": ["Linux/UNIX"], "AvailabilityZone": SPOT_A.az,
         "StartTime": start, "EndTime": end})
    got = market.price_history(SPOT_A, start.timestamp(), end.timestamp())
    assert got == [(start.timestamp(), 24.0), (datetime(2026, 11, 30, 2, 40, tzinfo=UTC).timestamp(), 31.0)]


def test_price_history_that_ec2_refuses_is_empty_and_on_demand_asks_nothing(
        stubbed: tuple[Ec2MarketData, Stubber]) -> None:
    market, stub = stubbed
    stub.add_client_error("describe_spot_price_history", "RequestLimitExceeded", "slow down")
    assert market.price_history(SPOT_A, NOW.timestamp() - 3600, NOW.timestamp()) == []  # the launch price stands
    stub.add_response("describe_spot_price_history", {"SpotPriceHistory": [
        {"AvailabilityZone": SPOT_A.az, "InstanceType": "p5.48xlarge", "Timestamp": NOW}]})  # no price in it
    assert market.price_history(SPOT_A, NOW.timestamp() - 3600, NOW.timestamp()) == []
    stub.add_response("describe_spot_price_history", {"SpotPriceHistory": [
        price(SPOT_A.az, "p5.48xlarge", "NaN", 0)]})  # a price that is no number: none either (NaN bills nothing)
    assert market.price_history(SPOT_A, NOW.timestamp() - 3600, NOW.timestamp()) == []
    on_demand = SPOT_A.model_copy(update={"market": "on-demand"})
    assert market.price_history(on_demand, NOW.timestamp() - 3600, NOW.timestamp()) == []  # (no call stubbed)
