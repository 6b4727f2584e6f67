"""moto's S3 answering as AWS does where the two differ."""

from __future__ import annotations

from typing import Any


class ConditionedListing:
    """The real S3 client, answering as S3 does a caller whose ListBucket is conditioned on ``s3:prefix``
    (the node roles): GetObject of a missing key is 403 AccessDenied, not 404 (S3 says 404 only to one
    that may list the bucket, and a GetObject carries no prefix). moto always says 404."""

    def __init__(self, real: Any) -> None:
        self.real = real

    def get_object(self, **kwargs: Any) -> Any:
        from botocore.exceptions import ClientError

        try:
            return self.real.get_object(**kwargs)
        except ClientError as exc:
            if exc.response["Error"]["Code"] in ("NoSuchKey", "404"):
                raise ClientError({"Error": {"Code": "AccessDenied", "Message": "Access Denied"}},
                                  "GetObject") from None
            raise

    def download_file(self, bucket: str, key: str, filename: str) -> None:
        from botocore.exceptions import ClientError

        if not self.real.list_objects_v2(Bucket=bucket, Prefix=key).get("Contents"):
            raise ClientError({"Error": {"Code": "403", "Message": "Forbidden"}}, "HeadObject")  # (no body)
        self.real.download_file(bucket, key, filename)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)
