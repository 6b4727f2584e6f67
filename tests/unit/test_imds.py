"""IMDSv2 client and IMDS monitors against the fake IMDS HTTP server."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from agent.imds import ImdsClient
from agent.monitors import NoticeKind, RebalanceMonitor, SpotInterruptionMonitor
from agent.notice_store import NoticeStore
from spotrelay.errors import ImdsUnavailableError
from spotrelay.local.fake_imds import FakeImds


@pytest.fixture
def imds() -> Iterator[FakeImds]:
    with FakeImds(instance_id="i-0abc", az="us-east-1b", tags={"spotrelay:job-id": "j-1"}) as server:
        yield server


def _client(imds: FakeImds, **kwargs: object) -> ImdsClient:
    # a hang bound only: the fake answers at once, or (down) closes the connection at once; a 2 s bound let
    # a stalled server thread on a loaded machine cost a retry, and the token/PUT counts asserted here moved
    return ImdsClient(imds.url, timeout_s=30.0, retries=2, backoff_s=0.01, **kwargs)  # type: ignore[arg-type]


def test_identity_and_one_token_for_many_reads(imds: FakeImds) -> None:
    client = _client(imds)
    assert client.instance_id() == "i-0abc"
    assert client.availability_zone() == "us-east-1b"
    assert client.region() == "us-east-1"
    assert client.private_ip() == "127.0.0.1"
    assert client.tags() == {"spotrelay:job-id": "j-1"}
    assert client.user_data() is None
    assert imds.token_requests == 1


def test_reads_without_token_are_refused(imds: FakeImds) -> None:
    import requests

    response = requests.get(f"{imds.url}/latest/meta-data/instance-id", timeout=30)  # a hang bound
    assert response.status_code == 401


def test_token_refreshed_after_ttl(imds: FakeImds) -> None:
    now = [1000.0]
    client = _client(imds, token_ttl_s=100, clock=lambda: now[0])
    client.instance_id()
    now[0] += 50  # inside 90% of the TTL: same token
    client.instance_id()
    assert imds.token_requests == 1
    now[0] += 45  # past 90%: a new token before the old one can expire
    client.instance_id()
    assert imds.token_requests == 2


def test_token_refreshed_on_401(imds: FakeImds) -> None:
    client = _client(imds)
    client.instance_id()
    imds.expire_tokens()  # IMDS forgot our token (e.g. restarted)
    assert client.instance_id() == "i-0abc"
    assert imds.token_requests == 2


def test_no_notice_is_404(imds: FakeImds) -> None:
    client = _client(imds)
    assert client.get("meta-data/spot/instance-action") is None
    assert SpotInterruptionMonitor(client).poll() == []
    assert RebalanceMonitor(client).poll() == []


def test_interruption_notice(imds: FakeImds) -> None:
    when = float(int(time.time()) + 120)
    imds.set_interruption("stop", when)
    [notice] = SpotInterruptionMonitor(_client(imds)).poll()
    assert notice.kind is NoticeKind.SPOT_INTERRUPTION
    assert notice.action == "stop" and notice.time == when
    assert notice.notice_id is None  # IMDS notices carry no id


def test_rebalance_notice(imds: FakeImds) -> None:
    when = float(int(time.time()))
    imds.set_rebalance(when)
    [notice] = RebalanceMonitor(_client(imds)).poll()
    assert notice.kind is NoticeKind.REBALANCE and notice.time == when
    assert SpotInterruptionMonitor(_client(imds)).poll() == []


def test_imds_down_raises_after_retries_then_recovers(imds: FakeImds) -> None:
    client = _client(imds)
    imds.set_up(False)
    with pytest.raises(ImdsUnavailableError):
        SpotInterruptionMonitor(client).poll()
    # a poll never hangs the agent: the agent's client (the defaults) bounds every request and retry;
    # checked on its settings, not timed, so a slow machine cannot fail it
    default = ImdsClient(imds.url)
    assert default.timeout_s <= 1.0 and default.retries * (default.timeout_s + default.backoff_s * default.retries) < 5
    assert sum(r.startswith("PUT") for r in imds.requests) == 2  # retried
    imds.set_up(True)
    assert client.instance_id() == "i-0abc"


def test_imds_unreachable_port() -> None:
    server = FakeImds().start()
    url = server.url
    server.stop()
    with pytest.raises(ImdsUnavailableError):
        ImdsClient(url, timeout_s=0.2, retries=2, backoff_s=0.01).instance_id()


def test_duplicate_notice_is_handed_on_once(imds: FakeImds) -> None:
    client = _client(imds)
    store = NoticeStore()
    now = time.time()
    imds.set_interruption("terminate", now + 120)
    monitor = SpotInterruptionMonitor(client)
    first = [store.add(n, now) for n in monitor.poll()]
    again = [store.add(n, now + 5) for n in monitor.poll()]
    assert first[0] is not None and first[0].deadline == pytest.approx(now + 120, abs=1)
    assert again == [None]
    # a new notice (different time) is new
    imds.set_interruption("terminate", now + 200)
    assert next(store.add(n, now + 6) for n in monitor.poll()) is not None
