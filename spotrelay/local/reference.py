"""The uninterrupted reference run the demo compares against: the same training command, run once
straight through under torchrun on this machine, without the agent or the controller."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from spotrelay.spec.models import JobSpec


def reference_command(spec: JobSpec, out_prefix: Path, checkpoint_dir: Path, nodes: int | None = None) -> list[str]:
    """torchrun with every node's processes on one host (``nodes``: default the spec's); the script's
    own args plus our outputs."""
    entry = spec.entrypoint
    if entry.script is None:
        raise ValueError("the reference run needs a spec with entrypoint.script")
    nproc = (nodes or spec.resources.nodes) * max(spec.resources.gpus_per_node, 1)
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        entry.script,
        *strip_out(entry.args),
        "--out",
        str(out_prefix),
        "--checkpoint-dir",
        str(checkpoint_dir),
    ]


def strip_out(args: list[str]) -> list[str]:
    """Drop ``--out X`` (the twin's per-node result path) from the script's args."""
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg == "--out":
            skip = True
        else:
            out.append(arg)
    return out


def start_reference(spec: JobSpec, work: Path, code_dir: Path, nodes: int | None = None) -> subprocess.Popen[bytes]:
    work.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPOTRELAY_", "AWS_"))}
    env.update(spec.entrypoint.env)
    cmd = reference_command(spec, work / "result", work / "checkpoints", nodes)
    (work / "started").touch()
    log = open(work / "train.log", "wb")  # noqa: SIM115 - the child owns it
    try:
        return subprocess.Popen(
            cmd, cwd=str(code_dir / spec.entrypoint.working_dir), env=env, stdout=log, stderr=subprocess.STDOUT
        )
    finally:
        log.close()


def read_results(prefix: Path) -> dict[int, dict[str, Any]]:
    """``<prefix>.rank<R>.json`` files written by the training script: rank -> result."""
    results = {}
    for path in sorted(prefix.parent.glob(prefix.name + ".rank*.json")):
        try:
            results[int(path.name.rsplit(".rank", 1)[1].split(".")[0])] = json.loads(path.read_text())
        except (ValueError, OSError):
            continue
    return results


def read_progress(prefix: Path) -> dict[int, list[list[float]]]:
    """``<prefix>.rank<R>.steps.jsonl``: rank -> [step, loss] pairs as they were computed (a node
    killed before writing its result file leaves these)."""
    found: dict[int, list[list[float]]] = {}
    for path in sorted(prefix.parent.glob(prefix.name + ".rank*.steps.jsonl")):
        try:
            rank = int(path.name.rsplit(".rank", 1)[1].split(".")[0])
            lines = path.read_text().splitlines()
        except (ValueError, OSError):
            continue
        pairs = []
        for line in lines:
            try:
                pairs.append(json.loads(line))
            except ValueError:  # the line being written when the node died
                break
        found[rank] = pairs
    return found
