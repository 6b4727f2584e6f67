"""moto's server on 127.0.0.1 (a free port), configured to run Step Functions and our Lambdas."""

from __future__ import annotations

import os
import random
import socket
from dataclasses import dataclass
from pathlib import Path

import requests

from spotrelay.local import lambda_seam

FAKE_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
}


def free_port(rng: random.Random | None = None) -> int:
    """A port free now, for a server that binds it later (a gang's rendezvous, moto's server).

    Picked below the kernel's ephemeral range: a port from bind(0) is released until its server
    binds it, and meanwhile any outgoing connection of this busy machine may take it as its source
    port (torchrun then fails with EADDRINUSE). Ports below the range are never handed out that way.
    """
    low = _ephemeral_low()
    draw = rng or random.SystemRandom()
    tries = 64 if low > _FIXED_FLOOR + 1000 else 0
    for _ in range(tries):
        port = draw.randrange(_FIXED_FLOOR, low)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue  # someone listens there already
            return port
    with socket.socket() as sock:  # no room below the range (an unusual kernel setting)
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


_FIXED_FLOOR = 20000  # above the well-known service ports people run locally (8080, 9000, ...)


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


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
