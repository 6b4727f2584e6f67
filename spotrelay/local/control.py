"""A small HTTP endpoint on 127.0.0.1 through which ``spotrelay local interrupt|kill|nodes`` reach a
running twin (``spotrelay local up``). The twin writes its address to a state file."""

from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import requests

from spotrelay.files import read_bounded
from spotrelay.local.compute import LocalCompute

STATE_FILE = Path(".spotrelay-twin.json")  # in the directory `spotrelay local up` runs in
MAX_STATE_BYTES = 64 * 1024  # the twin writes a few hundred bytes: a link to /dev/zero is not read for ever
ENV_URL = "SPOTRELAY_TWIN_URL"


class ControlServer:
    def __init__(self, compute: LocalCompute, env: dict[str, str]) -> None:
        self.compute = compute
        self.env = env
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True, name="twin-control")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> ControlServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def answer(self, method: str, path: str) -> tuple[int, dict[str, Any]]:
        parts = [p for p in path.split("/") if p]
        if method == "GET" and parts == ["nodes"]:
            return 200, {"nodes": self.compute.history()}
        if method == "GET" and parts == ["env"]:
            return 200, {"env": self.env}
        if method == "POST" and len(parts) == 2 and parts[0] in ("interrupt", "kill"):
            try:
                fault = self.compute.interrupt if parts[0] == "interrupt" else self.compute.kill
                return 200, {"instance_id": fault(parts[1]), "action": parts[0]}
            except KeyError as exc:
                return 404, {"error": str(exc.args[0])}
        return 404, {"error": f"no such call {method} {path}"}


def _handler(control: ControlServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            return

        def _reply(self, method: str) -> None:
            status, body = control.answer(method, self.path)
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._reply("GET")

        def do_POST(self) -> None:
            self._reply("POST")

    return Handler


def write_state(path: Path, url: str, env: dict[str, str]) -> None:
    path.write_text(json.dumps({"control_url": url, "env": env, "pid": os.getpid()}, indent=2))


def control_url(state_file: Path = STATE_FILE) -> str:
    """The running twin's control URL: ``$SPOTRELAY_TWIN_URL`` or the state file."""
    if os.environ.get(ENV_URL):
        return os.environ[ENV_URL]
    try:
        data = read_bounded(state_file, MAX_STATE_BYTES)
    except FileNotFoundError as exc:
        raise RuntimeError(f"no running twin: set {ENV_URL} or run `spotrelay local up` here") from exc
    except OSError as exc:
        raise RuntimeError(f"{state_file}: cannot read the twin's state file ({exc.strerror or exc})") from exc
    try:
        url = json.loads(data)["control_url"] if len(data) <= MAX_STATE_BYTES else None
    except (ValueError, KeyError, TypeError):  # (TypeError: JSON that is no object, a list)
        url = None
    if not isinstance(url, str):
        raise RuntimeError(f"{state_file}: not a twin state file (no control_url); `spotrelay local up` "
                           "writes one")
    return url


def call(method: str, path: str, state_file: Path = STATE_FILE) -> tuple[int, dict[str, Any]]:
    resp = requests.request(method, control_url(state_file) + path, timeout=10)
    return resp.status_code, resp.json()
