"""Health-check cost: what the per-step checks add to a training step, side by side.

    .venv/bin/python bench/health.py            # 2 gloo ranks, the tiny transformer, ~1 minute

Trains the tiny transformer of examples/tiny (DDP, 2 CPU ranks on gloo) through the training API
and alternates blocks of steps with the health checks on and off in the same processes (off: the
monitor is detached, so the boundary all-reduce carries only the stop decision's 3 integers), so
both see the same machine load. Prints, per rank 0: the mean step time with and without the
checks and their ratio, and the checks' own time per step (the monitor times itself) as a share of
the step. The target is <= 1 %. On a loaded machine the block ratio is noise-dominated; the
self-timed share is the stable number.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from examples.tiny.train import TinyLM, lm_loss  # noqa: E402
from spotrelay.contracts.health import HealthPolicy  # noqa: E402
from spotrelay.training import spotrelay_session  # noqa: E402


def _rank(rank: int, world: int, port: int, args: argparse.Namespace, out: Any) -> None:
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "LOCAL_RANK": str(rank),
                       "LOCAL_WORLD_SIZE": str(world)})  # fmt: skip
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    model = torch.nn.parallel.DistributedDataParallel(TinyLM(d_model=args.d_model))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with tempfile.TemporaryDirectory() as tmp:
        policy = HealthPolicy(warmup_steps=5, straggler_every=10)
        session = spotrelay_session(model, optimizer, checkpoint_dir=tmp, save_final=False, health=policy)
        monitor = session.health.monitor
        tokens = torch.randint(0, 64, (args.batch, 17), generator=torch.Generator().manual_seed(rank))
        times: dict[bool, list[float]] = {True: [], False: []}
        spent_before, on_steps = 0.0, 0
        steps = session.steps(args.blocks * args.block * 2)
        for block in range(args.blocks * 2):
            on = block % 2 == 0
            session.health.monitor = monitor if on else None
            spent_before = monitor.spent_s if monitor else 0.0
            t0 = time.perf_counter()
            for _ in range(args.block):
                next(steps)
                optimizer.zero_grad(set_to_none=True)
                loss = lm_loss(model, tokens)
                loss.backward()
                norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
                optimizer.step()
                session.step_done(loss, samples=args.batch, grad_norm=norm)
            # the block's last boundary runs on the next next(): close the block after it
            times[on].append((time.perf_counter() - t0) / args.block)
            if on and monitor is not None:
                on_steps += args.block
                out.put(("spent", rank, monitor.spent_s - spent_before))
        session.close()
    if rank == 0:
        out.put(("times", rank, times, on_steps))
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--blocks", type=int, default=6, help="pairs of (on, off) blocks")
    p.add_argument("--block", type=int, default=30, help="steps per block")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--d-model", type=int, default=64)
    args = p.parse_args()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = 29_000 + os.getpid() % 1000
    procs = [ctx.Process(target=_rank, args=(r, 2, port, args, out)) for r in range(2)]
    for proc in procs:
        proc.start()
    spent: list[float] = []
    times: dict[bool, list[float]] = {}
    on_steps = 0
    for proc in procs:
        proc.join()
    while not out.empty():
        item = out.get()
        if item[0] == "spent" and item[1] == 0:
            spent.append(item[2])
        elif item[0] == "times":
            times, on_steps = item[2], item[3]
    on, off = statistics.median(times[True]), statistics.median(times[False])
    own = sum(spent) / max(on_steps, 1)
    print(f"step time with checks {on * 1e3:.2f} ms, without {off * 1e3:.2f} ms (median of {len(times[True])} blocks)")
    print(f"checks' own time per step: {own * 1e6:.1f} us")
    print(f"ratio with/without: {on / off:.4f}  (block medians; noise on a loaded machine)")
    print(f"health checks cost: {own / off * 100:.3f} % of a step (target <= 1 %)")


if __name__ == "__main__":
    main()
