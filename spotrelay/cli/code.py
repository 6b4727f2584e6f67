"""``spotrelay submit`` with ``entrypoint.code: <local directory>``: pack it (respecting
.gitignore), upload it content-addressed to the jobs bucket (``code/<sha256>.tar.gz``, once per
content), and submit the spec with ``code`` pointing at the archive and its sha256."""

from __future__ import annotations

import json
from pathlib import Path

from spotrelay.cli.errors import UsageProblem
from spotrelay.errors import CodeArchiveError, NotFoundError
from spotrelay.spec.models import JobSpec


def local_code_dir(spec: JobSpec, spec_file: Path) -> Path | None:
    """The directory ``entrypoint.code`` names, relative to the spec file; None for s3:// or none."""
    code = spec.entrypoint.code
    if code is None or code.startswith("s3://"):
        return None
    root = (spec_file.parent / Path(code).expanduser()).resolve()
    if not root.is_dir():
        raise UsageProblem(f"{spec_file}: entrypoint.code: {code} is not a directory (paths are relative to the spec)")
    return root


def upload(spec: JobSpec, spec_file: Path, root: Path) -> tuple[bytes, str]:
    """(the spec to submit, as JSON, naming the uploaded archive; the archive's URI)."""
    from spotrelay.adapters.s3_object_store import S3ObjectStore
    from spotrelay.code.pack import pack
    from spotrelay.spec.load import parse_spec

    try:
        bundle = pack(root)
    except CodeArchiveError as exc:
        raise UsageProblem(f"{spec_file}: entrypoint.code: {exc}") from exc
    objects = S3ObjectStore()
    try:
        objects.head(bundle.key)  # the same content was uploaded before
    except NotFoundError:
        objects.put(bundle.key, bundle.data, "application/gzip")
    uri = f"s3://{objects.bucket}/{bundle.key}"
    data = spec.model_dump(mode="json", exclude_unset=True)
    data["entrypoint"].update(code=uri, code_sha256=bundle.sha256)
    body = json.dumps(data, indent=2).encode()
    parse_spec(body, source=str(spec_file))  # what the controller will read
    return body, uri
