"""moto's server on 127.0.0.1 (a free port), configured to run Step Functions and our Lambdas."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

import requests

from spotrelay.local import lambda_seam

FAKE_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class MotoServer:
    port: int
    _server: object

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """Environment that points boto3 (and our settings) at this server."""
        return {**FAKE_ENV, "AWS_ENDPOINT_URL": self.url, "MOTO_PORT": str(self.port)}

    def configure(self) -> None:
        requests.post(
            f"{self.url}/moto-api/config",
            json={"stepfunctions": {"execute_state_machine": True}, "lambda": {"use_docker": False}},
            timeout=10,
        ).raise_for_status()

    def reset(self) -> None:
        """Drop every resource (moto keeps the config)."""
        requests.post(f"{self.url}/moto-api/reset", timeout=10).raise_for_status()
        self.configure()

    def stop(self) -> None:
        self._server.stop()  # type: ignore[attr-defined]


def start(apply_env: bool = True) -> MotoServer:
    """Start a threaded moto server in this process with our Lambda seam installed."""
    from moto.server import ThreadedMotoServer

    lambda_seam.install()
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    moto = MotoServer(port, server)
    if apply_env:
        os.environ.update(moto.env())
        from spotrelay.settings import reset

        reset()
    moto.configure()
    return moto
