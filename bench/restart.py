"""A gang's restart after a recovery, the ``restart`` part of the demo's modeled downtime: from the
training command to the first step, run the way the agent runs it.

    python bench/restart.py [--rounds 3]

Trains the demo's job (examples/tiny/train.py, DeepSpeed ZeRO-2, 2 gloo ranks under torchrun, each
rank through the agent's wrapper ``agent.launcher``) to a checkpoint, then resumes copies of it in
fresh torchrun processes for one step, alternating the two variants round by round so both see the
same load: ``deferred`` (the default: the ranks import mlflow on first use, agent/deferred_imports.py)
and ``eager`` (``SPOTRELAY_DEFER_IMPORTS=0``: what every rank paid before). Each resume is timed from
the torchrun command to rank 0's ``resumed`` and ``first_step`` trainer events. Printed: per variant
the median seconds, the ratio deferred / eager, and whether every resume computed the same loss for the
resumed step (bit for bit).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from spotrelay.contracts.control import read_events  # noqa: E402

SAVED_STEP = 10
VARIANTS = ("eager", "deferred")


def torchrun(work: Path, name: str, steps: int, eager: bool, checkpoint_dir: Path, every: int | None) -> float:
    """Run the tiny job on 2 ranks; the wall time the command started."""
    control = work / f"ctl-{name}"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        "SPOTRELAY_CONTROL_DIR": str(control),
        "SPOTRELAY_DEFER_IMPORTS": "0" if eager else "1",
    }
    argv = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
        "-m", "agent.launcher", str(ROOT / "examples/tiny/train.py"), "--engine", "deepspeed",
        "--steps", str(steps), "--step-sleep", "0", "--checkpoint-dir", str(checkpoint_dir),
        "--out", str(work / f"out-{name}"),
        *(["--every", str(every)] if every else []),
    ]  # fmt: skip
    started = time.time()
    with open(work / f"{name}.log", "wb") as log:
        code = subprocess.run(argv, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT).returncode
    if code != 0:
        raise SystemExit(f"{name}: torchrun exited {code}, see {work / f'{name}.log'}")
    return started


def resume(work: Path, saved: Path, name: str, eager: bool) -> dict[str, float]:
    checkpoint_dir = work / f"ckpt-{name}"
    shutil.copytree(saved, checkpoint_dir)  # each resume starts from the same checkpoint
    started = torchrun(work, name, SAVED_STEP + 1, eager, checkpoint_dir, None)
    events, _ = read_events(work / f"ctl-{name}")
    at = {e.kind: e.time for e in events if e.kind in ("resumed", "first_step")}
    if set(at) != {"resumed", "first_step"}:
        raise SystemExit(f"{name}: no resumed/first_step event, see {work / f'{name}.log'}")
    losses = json.loads((work / f"out-{name}.rank0.json").read_text())["losses"]
    return {"resumed_s": at["resumed"] - started, "first_step_s": at["first_step"] - started, "loss": losses[-1][1]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3, help="resumes per variant, interleaved")
    p.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="spotrelay-restart-"))
    try:
        saved = work / "ckpt-saved"
        torchrun(work, "save", SAVED_STEP, False, saved, SAVED_STEP)
        runs: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
        for i in range(args.rounds):
            order = VARIANTS if i % 2 == 0 else VARIANTS[::-1]  # neither always goes first
            for variant in order:
                runs[variant].append(resume(work, saved, f"{variant}-{i}", variant == "eager"))
        load = os.getloadavg()[0]
        med = {v: {k: statistics.median(r[k] for r in runs[v]) for k in ("resumed_s", "first_step_s")} for v in runs}
        for v in VARIANTS:
            each = ", ".join(f"{r['first_step_s']:.1f}" for r in runs[v])
            m = med[v]
            print(f"{v:9s} command -> resumed {m['resumed_s']:5.1f} s, -> first step {m['first_step_s']:5.1f} s"
                  f" (median of {args.rounds}: {each})")  # fmt: skip
        ratio = med["deferred"]["first_step_s"] / med["eager"]["first_step_s"]
        saved_s = med["eager"]["first_step_s"] - med["deferred"]["first_step_s"]
        print(f"restart deferred / eager: {ratio:.2f} ({saved_s:+.1f} s saved), load average {load:.1f}")
        losses = {r["loss"] for v in runs for r in runs[v]}
        print(f"loss of step {SAVED_STEP + 1} identical in every resume: {'yes' if len(losses) == 1 else losses}")
    finally:
        if args.keep:
            print(f"work directory: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
