"""A fake EC2 instance metadata service (IMDSv2) on 127.0.0.1, one per simulated instance.

It speaks the parts of IMDS the agent reads: the session token (``PUT /latest/api/token`` with a TTL
header, then the token on every GET, 401 without a valid one), instance identity, placement, local
address, tags, user data, ``spot/instance-action`` and ``events/recommendations/rebalance`` (404 until
set). Tests and the local twin set a notice, switch the service down (connections are dropped
without an answer, as when IMDS is unreachable) and expire tokens.

    with FakeImds(instance_id="i-0abc") as imds:
        imds.set_interruption(action="terminate", when=time.time() + 120)
        ... point the agent at imds.url ...
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TOKEN_PATH = "/latest/api/token"
TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"
MAX_TTL_S = 21600


def iso(epoch: float) -> str:
    """IMDS time format: ``2026-11-30T08:22:00Z``."""
    return datetime.fromtimestamp(epoch, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class FakeImds:
    def __init__(
        self,
        instance_id: str = "i-0fake0000000000",
        region: str = "us-east-1",
        az: str = "us-east-1a",
        private_ip: str = "127.0.0.1",
        instance_type: str = "p5.48xlarge",
        tags: dict[str, str] | None = None,
        user_data: str | None = None,
        port: int = 0,
    ) -> None:
        self.instance_id = instance_id
        self.region = region
        self.az = az
        self.private_ip = private_ip
        self.instance_type = instance_type
        self.tags = dict(tags or {})
        self.user_data = user_data
        self.up = True
        self.token_requests = 0
        self.requests: list[str] = []  # "METHOD path", for assertions
        self._lock = threading.Lock()
        self._tokens: dict[str, float] = {}  # token -> expiry (epoch)
        self._instance_action: dict[str, str] | None = None
        self._rebalance: dict[str, str] | None = None
        self._server = _Server(("127.0.0.1", port), _handler_for(self))
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    # --- lifecycle ----------------------------------------------------------------------------
    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeImds:
        self._thread = threading.Thread(target=self._server.serve_forever, name=f"imds-{self.port}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> FakeImds:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- what tests and the twin change -------------------------------------------------------
    def set_interruption(self, action: str = "terminate", when: float | None = None) -> None:
        """Announce a spot interruption ``action`` at epoch ``when`` (default: in two minutes)."""
        moment = when if when is not None else time.time() + 120
        with self._lock:
            self._instance_action = {"action": action, "time": iso(moment)}

    def clear_interruption(self) -> None:
        with self._lock:
            self._instance_action = None

    def set_rebalance(self, when: float | None = None) -> None:
        with self._lock:
            self._rebalance = {"noticeTime": iso(when if when is not None else time.time())}

    def clear_rebalance(self) -> None:
        with self._lock:
            self._rebalance = None

    def set_up(self, up: bool) -> None:
        """Down: every connection is closed without an answer (IMDS unreachable)."""
        self.up = up

    def expire_tokens(self) -> None:
        with self._lock:
            self._tokens.clear()

    # --- request handling ---------------------------------------------------------------------
    def issue_token(self, ttl_s: int) -> str:
        token = secrets.token_urlsafe(24)
        with self._lock:
            self.token_requests += 1
            self._tokens[token] = time.time() + ttl_s
        return token

    def token_valid(self, token: str | None) -> bool:
        with self._lock:
            return token is not None and self._tokens.get(token, 0.0) > time.time()

    def lookup(self, path: str) -> tuple[int, str]:
        """Status and body for a GET of ``path`` (token already checked)."""
        with self._lock:
            action, rebalance = self._instance_action, self._rebalance
        tag_keys = "\n".join(sorted(self.tags))
        values: dict[str, str | None] = {
            "/latest/meta-data/instance-id": self.instance_id,
            "/latest/meta-data/instance-type": self.instance_type,
            "/latest/meta-data/local-ipv4": self.private_ip,
            "/latest/meta-data/placement/region": self.region,
            "/latest/meta-data/placement/availability-zone": self.az,
            "/latest/meta-data/spot/instance-action": json.dumps(action) if action else None,
            "/latest/meta-data/events/recommendations/rebalance": (json.dumps(rebalance) if rebalance else None),
            "/latest/meta-data/tags/instance": tag_keys if self.tags else None,
            "/latest/user-data": self.user_data,
        }
        if path.startswith("/latest/meta-data/tags/instance/"):
            value = self.tags.get(path.rsplit("/", 1)[1])
        else:
            value = values.get(path.rstrip("/"))
        return (200, value) if value is not None else (404, "")


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        # a client that gave up (short timeouts under load) is normal, not worth a traceback
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def _handler_for(imds: FakeImds) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            return

        def _answer(self, status: int, body: str = "", headers: dict[str, str] | None = None) -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(data)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)

        def _dropped(self) -> bool:
            imds.requests.append(f"{self.command} {self.path}")
            if imds.up:
                return False
            self.close_connection = True
            return True

        def do_PUT(self) -> None:
            if self._dropped():
                return
            if self.path != TOKEN_PATH:
                self._answer(404)
                return
            try:
                ttl = int(self.headers.get(TTL_HEADER, ""))
            except ValueError:
                self._answer(400, "missing or invalid TTL header")
                return
            if not 1 <= ttl <= MAX_TTL_S:
                self._answer(400, "TTL out of range")
                return
            self._answer(200, imds.issue_token(ttl), {TTL_HEADER: str(ttl)})

        def do_GET(self) -> None:
            if self._dropped():
                return
            if not imds.token_valid(self.headers.get(TOKEN_HEADER)):
                self._answer(401)
                return
            status, body = imds.lookup(self.path.split("?", 1)[0])
            self._answer(status, body)

    return Handler
