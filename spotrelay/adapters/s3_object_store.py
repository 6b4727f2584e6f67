"""ObjectStore port on S3 (the jobs bucket)."""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

from spotrelay.adapters.aws import client, error_code
from spotrelay.errors import NotFoundError, PermanentError
from spotrelay.settings import settings

_MISSING = ("404", "NoSuchKey", "NotFound")
_EMPTY = ("416", "InvalidRange")  # a Range request on an empty object
_DENIED = ("403", "AccessDenied")


class S3ObjectStore:
    def __init__(self, bucket: str | None = None) -> None:
        self.bucket = bucket or settings().bucket

    @property
    def _s3(self) -> Any:
        return client("s3")

    def head(self, key: str) -> tuple[int, str]:
        try:
            meta = self._s3.head_object(Bucket=self.bucket, Key=key)
        except ClientError as exc:
            if self._missing(exc, key):
                raise NotFoundError(f"s3://{self.bucket}/{key} not found") from exc
            raise
        return int(meta["ContentLength"]), str(meta["ETag"]).strip('"')

    def get(self, key: str, max_bytes: int | None = None) -> bytes:
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": key}
        if max_bytes is not None:
            kwargs["Range"] = f"bytes=0-{max_bytes}"  # one byte more than allowed, to detect overflow
        try:
            body: bytes = self._s3.get_object(**kwargs)["Body"].read()
        except ClientError as exc:
            if max_bytes is not None and error_code(exc) in _EMPTY:
                return b""
            if self._missing(exc, key):
                raise NotFoundError(f"s3://{self.bucket}/{key} not found") from exc
            raise
        if max_bytes is not None and len(body) > max_bytes:
            raise PermanentError(f"s3://{self.bucket}/{key} is larger than {max_bytes} bytes")
        return body

    def _missing(self, exc: ClientError, key: str) -> bool:
        """Whether a failed read of ``key`` means it is not there. S3 answers a missing key with 403, not
        404, to a caller whose ListBucket is conditioned on ``s3:prefix`` (a GetObject carries no prefix):
        the submission handlers' roles (cdk/permissions.py). A listing of exactly that key, which the
        condition allows, tells a deleted submission from a real denial; a caller that may not list
        keeps the denial."""
        code = error_code(exc)
        if code in _MISSING:
            return True
        if code not in _DENIED:
            return False
        try:
            found = self._s3.list_objects_v2(Bucket=self.bucket, Prefix=key, MaxKeys=1).get("Contents", [])
        except ClientError:
            return False
        return not any(obj.get("Key") == key for obj in found)

    def put(self, key: str, body: bytes, content_type: str = "application/octet-stream") -> str:
        out = self._s3.put_object(Bucket=self.bucket, Key=key, Body=body, ContentType=content_type)
        return str(out["ETag"]).strip('"')

    def list_keys(self, prefix: str) -> list[str]:
        keys: list[str] = []
        for page in self._s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            keys.extend(obj["Key"] for obj in page.get("Contents", []))
        return keys

    def delete(self, keys: list[str]) -> None:
        for start in range(0, len(keys), 1000):
            chunk = [{"Key": k} for k in keys[start : start + 1000]]
            self._s3.delete_objects(Bucket=self.bucket, Delete={"Objects": chunk, "Quiet": True})
