"""IMDSv2 client: a session token (PUT with a TTL, refreshed before it expires or on a 401), short
timeouts and a few quick retries, so a poll never blocks the agent for long.

IMDS answers in about a millisecond on a healthy instance; anything slower is a problem worth
reporting, not waiting for. ``get`` returns None for 404 (the normal "no notice" answer).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import requests

from spotrelay.errors import ImdsUnavailableError

DEFAULT_ENDPOINT = "http://169.254.169.254"
TOKEN_PATH = "/latest/api/token"
TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"


class ImdsClient:
    def __init__(
        self,
        endpoint: str = DEFAULT_ENDPOINT,
        token_ttl_s: int = 21600,
        timeout_s: float = 1.0,
        retries: int = 3,
        backoff_s: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.token_ttl_s = token_ttl_s
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self._clock = clock
        self._sleep = sleep
        self._token: str | None = None
        self._token_expires = 0.0
        self._session: requests.Session | None = None

    @property
    def session(self) -> requests.Session:
        if self._session is None:
            self._session = requests.Session()
            self._session.trust_env = False  # IMDS is link-local: never through an HTTP proxy
        return self._session

    # --- token --------------------------------------------------------------------------------
    def token(self) -> str:
        # refresh at 90% of the TTL so a token never expires between our check and IMDS's
        if self._token is None or self._clock() >= self._token_expires:
            response = self._send("PUT", TOKEN_PATH, {TTL_HEADER: str(self.token_ttl_s)})
            if response.status_code != 200:
                raise ImdsUnavailableError(f"IMDS token request answered {response.status_code}")
            self._token = response.text
            self._token_expires = self._clock() + 0.9 * self.token_ttl_s
        return self._token

    def invalidate_token(self) -> None:
        self._token = None

    # --- reads --------------------------------------------------------------------------------
    def get(self, path: str) -> str | None:
        """The text at ``/latest/<path>``; None when IMDS answers 404."""
        full = f"/latest/{path.lstrip('/')}"
        for _ in range(2):  # a 401 means our token expired early (IMDS restarted): refresh once
            response = self._send("GET", full, {TOKEN_HEADER: self.token()})
            if response.status_code == 401:
                self.invalidate_token()
                continue
            if response.status_code == 404:
                return None
            if response.status_code != 200:
                raise ImdsUnavailableError(f"IMDS {full} answered {response.status_code}")
            return response.text
        raise ImdsUnavailableError(f"IMDS {full} refused two fresh tokens")

    def get_json(self, path: str) -> Any:
        text = self.get(path)
        return None if text is None else json.loads(text)

    def meta(self, name: str) -> str | None:
        return self.get(f"meta-data/{name}")

    def instance_id(self) -> str | None:
        return self.meta("instance-id")

    def region(self) -> str | None:
        return self.meta("placement/region")

    def availability_zone(self) -> str | None:
        return self.meta("placement/availability-zone")

    def private_ip(self) -> str | None:
        return self.meta("local-ipv4")

    def instance_type(self) -> str | None:
        return self.meta("instance-type")

    def user_data(self) -> str | None:
        return self.get("user-data")

    def tags(self) -> dict[str, str]:
        """Instance tags (needs ``InstanceMetadataTags=enabled`` on the launch template)."""
        keys = self.meta("tags/instance")
        if not keys:
            return {}
        return {key: self.meta(f"tags/instance/{key}") or "" for key in keys.splitlines() if key}

    # --- transport ----------------------------------------------------------------------------
    def _send(self, method: str, path: str, headers: dict[str, str]) -> requests.Response:
        last: Exception | None = None
        for attempt in range(self.retries):
            try:
                response = self.session.request(method, self.endpoint + path, headers=headers, timeout=self.timeout_s)
            except requests.RequestException as exc:
                last = exc
            else:
                if response.status_code < 500:
                    return response
                last = ImdsUnavailableError(f"IMDS {path} answered {response.status_code}")
            if attempt < self.retries - 1:
                self._sleep(self.backoff_s * (2**attempt))
        raise ImdsUnavailableError(f"IMDS {method} {path} failed {self.retries} times: {last}") from last
