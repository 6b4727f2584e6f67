"""A bandwidth throttle in front of a local server: a TCP proxy on 127.0.0.1 that forwards every
connection to ``upstream`` and lets at most ``bytes_per_s`` through in each direction, summed over
all connections (one shared link, as a node's path to S3 is).

The twin puts it in front of moto's S3 (``AWS_ENDPOINT_URL_S3`` for the nodes) to show that a
final save still commits before the reclaim when S3 is slow; tests use it the same way. The chaos
campaign also injects S3 faults here (:class:`LinkFaults`): open connections dropped mid-transfer,
and new ones answered ``503 SlowDown`` / ``500 InternalError`` without reaching moto.

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


_S3_ERRORS = {
    "SlowDown": ("503 Slow Down", "Please reduce your request rate."),
    "InternalError": ("500 Internal Server Error", "We encountered an internal error. Please try again."),
}


class LinkFaults:
    """S3 faults queued for the proxy: each new connection takes the next one (if any)."""

    def __init__(self) -> None:
        self._queue: list[str] = []
        self._lock = threading.Lock()
        self.injected: dict[str, int] = {}

    def add(self, code: str, count: int) -> None:
        if code not in _S3_ERRORS:
            raise ValueError(f"unknown S3 fault {code!r}; known: {', '.join(_S3_ERRORS)}")
        with self._lock:
            self._queue += [code] * count

    def take(self) -> str | None:
        with self._lock:
            code = self._queue.pop(0) if self._queue else None
            if code:
                self.injected[code] = self.injected.get(code, 0) + 1
            return code


def s3_error_response(code: str) -> bytes:
    status, message = _S3_ERRORS[code]
    body = f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code><Message>{message}</Message></Error>'
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: application/xml\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return (head + body).encode()


class Throttle:
    def __init__(self, upstream_host: str, upstream_port: int, bytes_per_s: float, host: str = "127.0.0.1") -> None:
        self.faults = LinkFaults()
        self.dropped = 0
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
            code = self.faults.take()
            if code is not None:
                threading.Thread(target=self._refuse, args=(client, code), daemon=True).start()
                continue
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

    def open_connections(self) -> int:
        with self._lock:
            return len(self._sockets) // 2

    def drop_connections(self) -> int:
        """Reset every open connection now (mid-request or mid-transfer): a dropped connection."""
        with self._lock:
            sockets, self._sockets = list(self._sockets), set()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                sock.close()  # linger 0: the peer sees a reset, as when a load balancer drops it
        self.dropped += len(sockets) // 2
        return len(sockets) // 2

    @staticmethod
    def _refuse(client: socket.socket, code: str) -> None:
        """Read the request head, answer with an S3 error, close (the request never reaches S3)."""
        try:
            client.settimeout(5)
            head = b""
            while b"\r\n\r\n" not in head and len(head) < 65536:
                chunk = client.recv(CHUNK)
                if not chunk:
                    break
                head += chunk
            client.sendall(s3_error_response(code))
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                client.close()

    def _pump(self, src: socket.socket, dst: socket.socket, bucket: TokenBucket, up: bool) -> None:
        try:
            while True:
                data = src.recv(CHUNK)
                if not data:
                    break
                bucket.take(len(data))
                # counted before it is sent: a reader that has every byte sees them counted (counted after,
                # the last chunk raced the client's read), and under the lock: each connection has its own
                # pump threads, and `+=` from two of them at once can lose a count
                with self._lock:
                    if up:
                        self.bytes_up += len(data)
                    else:
                        self.bytes_down += len(data)
                dst.sendall(data)
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
