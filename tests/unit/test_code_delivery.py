"""Code delivery: a reproducible, .gitignore-aware pack, and an unpack that refuses every archive
that could write outside its directory or fill the disk."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from spotrelay.code import pack as pack_mod
from spotrelay.code import unpack as unpack_mod
from spotrelay.code.pack import list_files, pack
from spotrelay.code.unpack import MARKER, sha256_file, unpack
from spotrelay.errors import CodeArchiveError


def _tree(root: Path) -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "train.py").write_text("print('hi')\n")
    (root / "pkg" / "model.py").write_text("X = 1\n")
    (root / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(root / "run.sh", 0o755)
    (root / "data").mkdir()
    (root / "data" / "shard.bin").write_bytes(b"\0" * 100)
    (root / "ckpt.pt").write_bytes(b"weights")
    (root / ".gitignore").write_text("# big things\n*.pt\ndata/\n")
    return root


def test_pack_respects_gitignore_and_is_reproducible(tmp_path: Path) -> None:
    root = _tree(tmp_path / "proj")
    assert list_files(root) == [".gitignore", "pkg/model.py", "run.sh", "train.py"]
    first = pack(root)
    os.utime(root / "train.py", (1, 1))  # times are not content
    assert pack(root).sha256 == first.sha256
    (root / "train.py").write_text("print('changed')\n")
    assert pack(root).sha256 != first.sha256


def test_pack_in_a_git_work_tree_uses_git(tmp_path: Path) -> None:
    root = _tree(tmp_path / "repo")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    (root / "notes.log").write_text("x")
    (root / ".git" / "info" / "exclude").write_text("*.log\n")
    assert list_files(root) == [".gitignore", "pkg/model.py", "run.sh", "train.py"]


def test_pack_refuses_a_link_out_of_the_directory(tmp_path: Path) -> None:
    root = _tree(tmp_path / "proj")
    (root / "secrets").symlink_to("/etc")
    with pytest.raises(CodeArchiveError, match="outside the code directory"):
        pack(root)


def test_round_trip_keeps_content_and_the_executable_bit(tmp_path: Path) -> None:
    bundle = pack(_tree(tmp_path / "proj"))
    archive = tmp_path / "code.tar.gz"
    archive.write_bytes(bundle.data)
    dest = unpack(archive, tmp_path / "node" / "code", bundle.sha256)
    assert (dest / "pkg" / "model.py").read_text() == "X = 1\n" and os.access(dest / "run.sh", os.X_OK)
    assert not (dest / "ckpt.pt").exists() and (dest / MARKER).read_text() == bundle.sha256
    (dest / "mine").write_text("kept")  # unpacked once: a survivor's next attempt reuses it
    assert unpack(archive, dest, bundle.sha256) == dest and (dest / "mine").exists()


def _archive(tmp_path: Path, *members: tuple[tarfile.TarInfo, bytes | None]) -> Path:
    path = tmp_path / "evil.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for info, body in members:
            if body is not None:
                info.size = len(body)
            tar.addfile(info, io.BytesIO(body) if body is not None else None)
    return path


def _info(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info


@pytest.mark.parametrize(("members", "message"), [
    ([(_info("/etc/cron.d/x"), b"x")], "absolute path"),
    ([(_info("../../outside.py"), b"x")], "uses '..'"),
    ([(_info("a/../../outside.py"), b"x")], "uses '..'"),
    ([(_info("ok/link", tarfile.SYMTYPE, "../../../etc/passwd"), None)], "leaves the directory"),
    ([(_info("abs-link", tarfile.SYMTYPE, "/etc/passwd"), None)], "leaves the directory"),
    ([(_info("hard", tarfile.LNKTYPE, "../outside"), None)], "hard link"),
    ([(_info("dev", tarfile.CHRTYPE), None)], "device"),
    ([(_info("fifo", tarfile.FIFOTYPE), None)], "device or FIFO"),
])
def test_unpack_refuses_archives_that_escape(tmp_path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]],
                                             message: str) -> None:
    archive = _archive(tmp_path, *members)
    with pytest.raises(CodeArchiveError, match=message):
        unpack(archive, tmp_path / "node" / "code", None)
    assert not (tmp_path / "node" / "code").exists() and not (tmp_path.parent / "outside.py").exists()


def test_unpack_stops_at_the_size_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(unpack_mod, "MAX_UNPACKED_BYTES", 1000)
    archive = _archive(tmp_path, (_info("zeros.bin"), b"\0" * 5000))  # compresses to a few bytes
    with pytest.raises(CodeArchiveError, match="unpacks to more than"):
        unpack(archive, tmp_path / "code", None)


def test_unpack_refuses_a_tampered_or_truncated_archive(tmp_path: Path) -> None:
    bundle = pack(_tree(tmp_path / "proj"))
    archive = tmp_path / "code.tar.gz"
    archive.write_bytes(bundle.data[:-40])
    with pytest.raises(CodeArchiveError, match="sha256"):
        unpack(archive, tmp_path / "code", bundle.sha256)
    with pytest.raises(CodeArchiveError, match="cannot be"):
        unpack(archive, tmp_path / "code", sha256_file(archive))


def test_pack_limits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _tree(tmp_path / "proj")
    monkeypatch.setattr(pack_mod, "MAX_FILES", 2)
    with pytest.raises(CodeArchiveError, match="files to pack"):
        pack(root)
    with pytest.raises(CodeArchiveError, match="not a directory"):
        pack(root / "train.py")
