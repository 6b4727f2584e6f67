"""Pack a code directory into a reproducible .tar.gz: the same files give the same bytes, so the
archive's sha256 names it and an unchanged directory is uploaded once.

Files: what git would commit when the directory is in a git work tree (tracked plus untracked not
ignored: ``git ls-files --cached --others --exclude-standard``); otherwise every file except those
the directory's own ``.gitignore`` matches (plain patterns, ``dir/`` and ``*`` globs; no negation).
``.git`` is never packed. Entries carry no owner, time or mode beyond the executable bit.
"""

from __future__ import annotations

import fnmatch
import gzip
import hashlib
import io
import os
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

from spotrelay.errors import CodeArchiveError

MAX_PACKED_BYTES = 256 * 2**20
MAX_FILES = 20_000


@dataclass(frozen=True)
class Bundle:
    data: bytes
    sha256: str
    files: int

    @property
    def key(self) -> str:
        from spotrelay.resources import RESOURCES

        return f"{RESOURCES.code_prefix}{self.sha256}.tar.gz"


def _git_files(root: Path) -> list[str] | None:
    try:
        inside = subprocess.run(["git", "-C", str(root), "rev-parse", "--is-inside-work-tree"], capture_output=True,
                                text=True, timeout=30)
        if inside.returncode != 0 or inside.stdout.strip() != "true":
            return None
        listed = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others",
                                 "--exclude-standard", "--", "."], capture_output=True, check=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return [p for p in listed.stdout.decode().split("\0") if p]


def _ignored(rel: str, patterns: list[str], is_dir: bool) -> bool:
    name = rel.rsplit("/", 1)[-1]
    for pattern in patterns:
        dir_only = pattern.endswith("/")
        pat = pattern.strip("/")
        if dir_only and not is_dir:
            continue
        target = rel if "/" in pattern.rstrip("/") else name
        if fnmatch.fnmatchcase(target, pat):
            return True
    return False


def _walk_files(root: Path) -> list[str]:
    ignore = root / ".gitignore"
    patterns = [line.strip() for line in ignore.read_text().splitlines()
                if line.strip() and not line.startswith(("#", "!"))] if ignore.is_file() else []
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        rel_dir = "" if rel_dir == "." else rel_dir + "/"
        dirnames[:] = [d for d in dirnames if d != ".git" and not _ignored(rel_dir + d, patterns, True)]
        links = [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]  # packed as links, not walked
        dirnames[:] = [d for d in dirnames if d not in links]
        found += [rel_dir + f for f in [*filenames, *links] if not _ignored(rel_dir + f, patterns, False)]
    return found


def list_files(root: Path) -> list[str]:
    files = _git_files(root)
    if files is None:
        files = _walk_files(root)
    return sorted(f for f in files if not f.startswith(".git/") and os.path.lexists(root / f))


def pack(root: Path) -> Bundle:
    root = root.resolve()
    if not root.is_dir():
        raise CodeArchiveError(f"{root} is not a directory")
    files = list_files(root)
    if len(files) > MAX_FILES:
        raise CodeArchiveError(f"{root} holds {len(files)} files to pack; the limit is {MAX_FILES} (.gitignore "
                               "what the job does not need)")
    raw = io.BytesIO()
    with (gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, compresslevel=6) as gz,
          tarfile.open(fileobj=gz, mode="w", format=tarfile.GNU_FORMAT) as tar):
        for rel in files:
            tar.addfile(*_entry(root, rel))
            if raw.tell() > MAX_PACKED_BYTES:
                raise CodeArchiveError(f"{root} packs to more than {MAX_PACKED_BYTES // 2**20} MiB; keep data "
                                       "and checkpoints out of the code directory (.gitignore them)")
    data = raw.getvalue()
    return Bundle(data, hashlib.sha256(data).hexdigest(), len(files))


def _entry(root: Path, rel: str) -> tuple[tarfile.TarInfo, io.BytesIO | None]:
    path = root / rel
    info = tarfile.TarInfo(rel)
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
    if path.is_symlink():
        target = os.readlink(path)
        resolved = (path.parent / target).resolve()
        if os.path.isabs(target) or not resolved.is_relative_to(root):
            raise CodeArchiveError(f"{rel} links to {target}, outside the code directory")
        info.type, info.linkname, info.mode = tarfile.SYMTYPE, target, 0o777
        return info, None
    body = path.read_bytes()
    info.size = len(body)
    info.mode = 0o755 if os.access(path, os.X_OK) else 0o644
    return info, io.BytesIO(body)
