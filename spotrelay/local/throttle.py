"""A bandwidth throttle in front of a local server: a TCP proxy on 127.0.0.1 that forwards every
connection to ``upstream`` and lets at most ``bytes_per_s`` through in each direction, summed over
all connections (one shared link, as a node's path to S3 is).

The twin puts it in front of moto's S3 (``AWS_ENDPOINT_URL_S3`` for the nodes) to show that a
final save still commits before the reclaim when S3 is slow; tests use it the same way.

    with Throttle("127.0.0.1", moto_port, bytes_per_s=4_000_000) as t:
        env["AWS_ENDPOINT_URL_S3"] = t.url
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable

CHUNK = 16 * 1024


class TokenBucket:
    """``rate`` bytes/s with a burst of ``burst`` bytes; ``take`` blocks until ``n`` bytes may pass."""

    def __init__(
        self,
        rate: float,
        burst: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if rate <= 0:
            raise ValueError(f"throttle rate must be > 0 bytes/s, got {rate}")
        self.rate = rate
        self.burst = burst if burst is not None else max(rate / 10, CHUNK)
        self.clock, self.sleep = clock, sleep
        self._tokens = self.burst
        self._last = clock()
        self._lock = threading.Lock()

    def take(self, n: int) -> None:
        with self._lock:  # one waiter at a time: the link is shared, first come first served
            now = self.clock()
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
            self._last = now
            self._tokens -= n
            debt = -self._tokens
        if debt > 0:
            self.sleep(debt / self.rate)


class Throttle:
    def __init__(self, upstream_host: str, upstream_port: int, bytes_per_s: float, host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self.up = TokenBucket(bytes_per_s)  # client -> server (uploads)
        self.down = TokenBucket(bytes_per_s)  # server -> client (downloads)
        self._listener = socket.create_server((host, 0))
        self.host, self.port = host, int(self._listener.getsockname()[1])
        self._stopped = threading.Event()
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.bytes_up = self.bytes_down = 0

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> Throttle:
        threading.Thread(target=self._accept, name="throttle-accept", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            for sock in list(self._sockets):
                with contextlib.suppress(OSError):
                    sock.close()

    def __enter__(self) -> Throttle:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=10)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets.update((client, server))
            for src, dst, bucket, up in ((client, server, self.up, True), (server, client, self.down, False)):
                threading.Thread(target=self._pump, args=(src, dst, bucket, up), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, bucket: TokenBucket, up: bool) -> None:
        try:
            while True:
                data = src.recv(CHUNK)
                if not data:
                    break
                bucket.take(len(data))
                dst.sendall(data)
                if up:
                    self.bytes_up += len(data)
                else:
                    self.bytes_down += len(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)  # half-close: the other direction may still be sending
            with self._lock:
                closing = [s for s in (src, dst) if s in self._sockets]
            if not up:  # the server's side ended: the connection is done
                for sock in closing:
                    with contextlib.suppress(OSError):
                        sock.close()
                    with self._lock:
                        self._sockets.discard(sock)
