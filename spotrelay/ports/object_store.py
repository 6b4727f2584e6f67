"""Objects in the jobs bucket (submissions, rejections, checkpoints)."""

from __future__ import annotations

from typing import Protocol


class ObjectStore(Protocol):
    def head(self, key: str) -> tuple[int, str]:
        """(size in bytes, etag) or ``NotFoundError``."""

    def get(self, key: str, max_bytes: int | None = None) -> bytes: ...

    def put(self, key: str, body: bytes, content_type: str = "application/octet-stream") -> str:
        """Write and return the etag."""

    def list_keys(self, prefix: str) -> list[str]: ...

    def delete(self, keys: list[str]) -> None: ...
