"""Mount the region's FSx for Lustre where the spec's ``dataset.fsx.mount_path`` says, before any rank.

The training stacks create one SCRATCH_2 file system per region when the deployment sets
``fsx_enabled`` (cdk/regional_stack.py), linked to the data bucket's ``data/``; the compute adapter
tags each instance with it (``spotrelay:fsx-source``: ``<dns>@tcp:/<mount name>``), which the agent
reads as ``AgentConfig.fsx_source``. The Deep Learning AMIs carry the Lustre client. A node that was
told to mount and cannot is an infrastructure failure of this attempt (no rank starts), not the
user's: the submission handler already refused ``dataset.fsx`` on a deployment without FSx.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spotrelay.errors import SpotrelayError
from spotrelay.spec.models import JobSpec

MOUNT_TIMEOUT_S = 120.0
MOUNT_OPTIONS = "relatime,flock"  # flock: the AWS-documented options for a Lustre client mount
Runner = Callable[..., "subprocess.CompletedProcess[Any]"]


class FsxMountError(SpotrelayError):
    """The spec asks for the file system and this node cannot mount it."""


def mounted(path: str, mounts: Path = Path("/proc/mounts")) -> bool:
    """Whether a Lustre file system is mounted at ``path`` (an agent restarted on the node finds it)."""
    try:
        lines = mounts.read_text().splitlines()
    except OSError:
        return False
    path = os.path.normpath(path)  # (/fsx/ is /fsx)
    return any(len(f) >= 3 and f[1] == path and f[2] == "lustre" for f in (line.split() for line in lines))


def mount_dataset(spec: JobSpec, source: str | None, run: Runner = subprocess.run,
                  mounts: Path = Path("/proc/mounts")) -> str | None:
    """Mount ``source`` at the spec's ``dataset.fsx.mount_path``; the path, or None when the spec asks
    for no file system. ``FsxMountError`` names the source, the path and mount's own words."""
    fsx = spec.dataset.fsx if spec.dataset is not None else None
    if fsx is None:
        return None
    path = fsx.mount_path
    if not source:
        raise FsxMountError(f"dataset.fsx: no FSx for Lustre file system in this node's region (set the "
                            f"deployment's fsx_enabled); nothing mounted at {path}")
    if mounted(path, mounts):
        return path
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
        done = run(["mount", "-t", "lustre", "-o", MOUNT_OPTIONS, source, path],
                   capture_output=True, text=True, timeout=MOUNT_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise FsxMountError(f"dataset.fsx: mounting {source} at {path} failed: {exc}") from exc
    if done.returncode != 0:
        said = (done.stderr or done.stdout or "").strip()[-300:]
        raise FsxMountError(f"dataset.fsx: mounting {source} at {path} failed (exit {done.returncode}): {said}")
    return path
