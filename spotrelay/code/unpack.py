"""Unpack a job's code archive safely on a node: hash-checked, every member inspected first.

Refused: absolute names, ``..`` anywhere, links (symbolic or hard) whose target leaves the
directory, devices and FIFOs, more than ``MAX_MEMBERS`` members or ``MAX_UNPACKED_BYTES`` in all
(a gzip bomb stops at the limit, not at the disk's end). Python's ``data`` extraction filter then
runs as a second line. The archive is unpacked beside its final place and renamed into it, with a
marker naming its sha256, so a half-unpacked tree is never used and a survivor reuses its copy.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import shutil
import tarfile
from pathlib import Path

from spotrelay.errors import CodeArchiveError

MAX_MEMBERS = 50_000
MAX_UNPACKED_BYTES = 2 * 2**30
MARKER = ".spotrelay-code-sha256"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _escapes(path: str) -> bool:
    normal = posixpath.normpath(path)
    return path.startswith("/") or normal == ".." or normal.startswith("../") or ".." in path.split("/")


def check_members(archive: Path) -> None:
    """Raise ``CodeArchiveError`` naming the first member that could write outside the directory."""
    count = total = 0
    try:
        with tarfile.open(archive, "r:gz") as tar:
            for member in tar:
                count += 1
                if count > MAX_MEMBERS:
                    raise CodeArchiveError(f"the code archive has more than {MAX_MEMBERS} entries")
                name = member.name
                if _escapes(name) or (len(name) > 1 and name[1] == ":"):
                    raise CodeArchiveError(f"the code archive's entry {name!r} is an absolute path or uses '..'")
                if member.isdev() or member.isfifo():
                    raise CodeArchiveError(f"the code archive's entry {name!r} is a device or FIFO")
                if member.issym():
                    target = posixpath.join(posixpath.dirname(name), member.linkname)
                    if member.linkname.startswith("/") or _escapes(posixpath.normpath(target)):
                        raise CodeArchiveError(f"the code archive's link {name!r} -> {member.linkname!r} "
                                               "leaves the directory")
                if member.islnk() and _escapes(member.linkname):
                    raise CodeArchiveError(f"the code archive's hard link {name!r} -> {member.linkname!r} "
                                           "leaves the directory")
                total += max(member.size, 0)
                if total > MAX_UNPACKED_BYTES:
                    raise CodeArchiveError(f"the code archive unpacks to more than {MAX_UNPACKED_BYTES // 2**20} MiB")
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise CodeArchiveError(f"the code archive cannot be read: {exc}") from exc


def unpack(archive: Path, dest: Path, sha256: str | None) -> Path:
    """Verify and unpack ``archive`` into ``dest`` (reused when it already holds this sha256)."""
    actual = sha256_file(archive)
    if sha256 is not None and actual != sha256:
        raise CodeArchiveError(f"the code archive's sha256 is {actual}, not {sha256} as the spec says")
    marker = dest / MARKER
    if marker.is_file() and marker.read_text().strip() == actual:
        return dest
    check_members(archive)
    staging = dest.with_name(f".{dest.name}.unpacking-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        with tarfile.open(archive, "r:gz") as tar:
            tar.extractall(staging, filter="data")
    except (tarfile.TarError, OSError) as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise CodeArchiveError(f"the code archive cannot be unpacked: {exc}") from exc
    (staging / MARKER).write_text(actual)
    shutil.rmtree(dest, ignore_errors=True)
    staging.rename(dest)
    return dest
