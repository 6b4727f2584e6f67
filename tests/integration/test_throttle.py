"""The bandwidth throttle in front of moto's server: S3 through it works, byte for byte, and every
byte is counted on its way (what the twin relies on to slow S3 down for the nodes)."""

from __future__ import annotations

import os

import boto3

from spotrelay.local.throttle import Throttle


def test_s3_through_the_throttle_round_trips_and_is_counted(aws: dict[str, str]) -> None:
    port = int(os.environ["AWS_ENDPOINT_URL"].rsplit(":", 1)[1])
    body = os.urandom(3 * 1024 * 1024 + 17)
    with Throttle("127.0.0.1", port, bytes_per_s=50_000_000) as throttle:
        s3 = boto3.client("s3", endpoint_url=throttle.url, region_name="us-east-1")
        s3.put_object(Bucket=aws["bucket"], Key="throttled/blob", Body=body)
        assert s3.get_object(Bucket=aws["bucket"], Key="throttled/blob")["Body"].read() == body
        assert throttle.bytes_up >= len(body) and throttle.bytes_down >= len(body)
    # the server behind it holds the same bytes
    direct = boto3.client("s3", region_name="us-east-1")
    assert direct.get_object(Bucket=aws["bucket"], Key="throttled/blob")["Body"].read() == body


def test_injected_s3_faults_reach_the_client_and_retries_get_through(aws: dict[str, str]) -> None:
    """The chaos campaign's S3 faults: queued SlowDown / InternalError answers (moto never sees
    those requests) and reset connections; botocore's retries carry a client through them."""
    from botocore.config import Config

    port = int(os.environ["AWS_ENDPOINT_URL"].rsplit(":", 1)[1])
    with Throttle("127.0.0.1", port, bytes_per_s=50_000_000) as throttle:
        s3 = boto3.client("s3", endpoint_url=throttle.url, region_name="us-east-1",
                          config=Config(retries={"max_attempts": 8, "mode": "standard"}))
        s3.put_object(Bucket=aws["bucket"], Key="faulty/warm", Body=b"w")  # a pooled connection
        assert throttle.drop_connections() >= 1
        throttle.faults.add("SlowDown", 1)
        throttle.faults.add("InternalError", 2)
        put = s3.put_object(Bucket=aws["bucket"], Key="faulty/blob", Body=b"y")  # reset, 503, 500, 500, through
        assert throttle.faults.injected == {"SlowDown": 1, "InternalError": 2}
        assert put["ResponseMetadata"]["RetryAttempts"] >= 3
    direct = boto3.client("s3", region_name="us-east-1")
    assert direct.get_object(Bucket=aws["bucket"], Key="faulty/blob")["Body"].read() == b"y"
