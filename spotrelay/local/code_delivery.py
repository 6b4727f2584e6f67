"""The twin delivers a job's code as AWS does: packed, uploaded to the jobs bucket (moto) as
``code/<sha256>.tar.gz``, fetched and unpacked by each node's agent. Nothing of the repository is
linked into the nodes' disks (``TwinOptions.code_dir`` stays an empty "AMI").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from spotrelay.code.pack import pack
from spotrelay.errors import NotFoundError


def upload_code(root: Path) -> tuple[str, str]:
    """Pack ``root`` and put it in the jobs bucket once; (s3 URI, sha256)."""
    from spotrelay.adapters.s3_object_store import S3ObjectStore

    bundle, objects = pack(root), S3ObjectStore()
    try:
        objects.head(bundle.key)
    except NotFoundError:
        objects.put(bundle.key, bundle.data, "application/gzip")
    return f"s3://{objects.bucket}/{bundle.key}", bundle.sha256


def deliver_script_dir(spec_text: str, base: Path, outputs: tuple[str, ...] = ("--out",)) -> str:
    """The spec with its script's directory delivered as ``entrypoint.code``: the script runs from
    the unpacked copy. Relative paths given to ``outputs`` flags move up one level, so what the
    script writes still lands on the node's disk beside the agent's files, not in the code."""
    data: dict[str, Any] = yaml.safe_load(spec_text)
    entry = data["entrypoint"]
    script = Path(entry["script"])
    uri, sha = upload_code((base / entry.get("working_dir", ".") / script.parent).resolve())
    args = list(entry.get("args", []))
    for i, arg in enumerate(args[:-1]):
        if arg in outputs and not Path(args[i + 1]).is_absolute():
            args[i + 1] = f"../{args[i + 1]}"
    entry.update(script=script.name, working_dir=".", code=uri, code_sha256=sha, args=args)
    return yaml.safe_dump(data, sort_keys=False)
