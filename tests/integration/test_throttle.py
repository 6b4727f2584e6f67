"""The bandwidth throttle in front of moto's server: S3 through it works, byte for byte, and every
byte is counted on its way (what the twin relies on to slow S3 down for the nodes)."""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any

import boto3
import pytest

from spotrelay.local.throttle import Throttle
from tests.integration.controller_doubles import wait_until


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


def test_every_byte_a_client_read_is_counted_already(aws: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The count includes a response's last chunk by the time the client has it (it was counted after the
    send: the last chunk raced the reader, stop 24's one failed run of ten). The throttle's pump threads
    are made slow right after each send, as a loaded machine may make them."""
    sendall = socket.socket.sendall

    def slow_after_pumping(sock: socket.socket, data: Any, *args: Any) -> None:
        sendall(sock, data, *args)
        if "_pump" in threading.current_thread().name:
            time.sleep(0.05)

    monkeypatch.setattr(socket.socket, "sendall", slow_after_pumping)
    port = int(os.environ["AWS_ENDPOINT_URL"].rsplit(":", 1)[1])
    body = os.urandom(64 * 1024 + 5)
    with Throttle("127.0.0.1", port, bytes_per_s=500_000_000) as throttle:
        s3 = boto3.client("s3", endpoint_url=throttle.url, region_name="us-east-1")
        s3.put_object(Bucket=aws["bucket"], Key="counted/blob", Body=body)
        for n in range(1, 11):
            assert s3.get_object(Bucket=aws["bucket"], Key="counted/blob")["Body"].read() == body
            seen = throttle.bytes_down
            assert seen >= n * len(body), f"read {n}: {seen} < {n * len(body)}"
            time.sleep(0.2)  # longer than a pump's stall: a chunk still to be counted would show now
            assert throttle.bytes_down == seen, f"read {n}: {throttle.bytes_down - seen} bytes counted after the read"


def test_injected_s3_faults_reach_the_client_and_retries_get_through(aws: dict[str, str]) -> None:
    """The chaos campaign's S3 faults: a connection reset mid-upload, then queued SlowDown /
    InternalError answers (moto never sees those requests); botocore's retries carry a client through
    them. moto's server closes each connection after its response, so the reset is made while an
    upload is in flight (a slow link), not on an idle pooled connection, which may already be gone."""
    from botocore.config import Config

    port = int(os.environ["AWS_ENDPOINT_URL"].rsplit(":", 1)[1])
    body = os.urandom(2 * 1024 * 1024)
    with Throttle("127.0.0.1", port, bytes_per_s=100_000) as throttle:  # about 20 s for the body
        s3 = boto3.client("s3", endpoint_url=throttle.url, region_name="us-east-1",
                          config=Config(retries={"max_attempts": 8, "mode": "standard"}))
        done: dict[str, Any] = {}
        upload = threading.Thread(target=lambda: done.update(
            put=s3.put_object(Bucket=aws["bucket"], Key="faulty/blob", Body=body)))  # fmt: skip
        upload.start()
        wait_until(lambda: throttle.bytes_up > 0 and throttle.open_connections() > 0,
                   what="the upload in flight")  # (the project's 300 s hang bound)
        throttle.faults.add("SlowDown", 1)  # the retries' new connections take these
        throttle.faults.add("InternalError", 2)
        assert throttle.drop_connections() >= 1
        throttle.up.rate = throttle.down.rate = 50_000_000  # the retry that gets through is quick
        upload.join(timeout=120)
        assert not upload.is_alive(), "the upload did not end"
        assert throttle.faults.injected == {"SlowDown": 1, "InternalError": 2}
        assert done["put"]["ResponseMetadata"]["RetryAttempts"] >= 4  # reset, 503, 500, 500, through
    direct = boto3.client("s3", region_name="us-east-1")
    assert direct.get_object(Bucket=aws["bucket"], Key="faulty/blob")["Body"].read() == body
