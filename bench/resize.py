"""Resume after a change of world size vs a same-size resume of the same checkpoint.

    python bench/checkpoint.py --resize [--engines ddp,fsdp2,zero2,zero3] [--state-mb 60]

A run on 2 gloo ranks trains one step of an MLP (Linear(width, width) layers, AdamW) and saves it.
Copies of that checkpoint are then resumed on 2 (same size), 1 and 3 ranks, each in fresh torchrun
processes; after a barrier (every rank's engine is set up), each rank times ``Session.resume()``
(pick + verify sha256 + load + trainer state), and the slowest rank counts. Printed: each time and the
ratio to the same-size resume (target <= 1.5x).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SAVE_WORLD, RESUME_WORLDS = 2, (2, 1, 3)
ENGINES = "ddp,fsdp2,zero2,zero3"  # every engine the training API supports (issue 13's target)


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from spotrelay.training import spotrelay_session

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model: Any = torch.nn.Sequential(*[torch.nn.Linear(args.width, args.width) for _ in range(args.layers)])
    world = int(os.environ["WORLD_SIZE"])
    if args.engine in ("ddp", "fsdp2"):
        dist.init_process_group("gloo")
        if args.engine == "ddp":
            model = torch.nn.parallel.DistributedDataParallel(model)
        else:  # each layer its own FSDP2 unit, sharded over the world: a resize reshards every tensor
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard

            mesh = init_device_mesh("cpu", (world,))
            for layer in model:
                fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        session = spotrelay_session(model, optimizer, checkpoint_dir=args.checkpoint_dir)
        stepper = optimizer
    else:
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo")
        config = {
            "train_batch_size": world, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
            "zero_optimization": {"stage": int(args.engine[-1])}, "steps_per_print": 10**9,
        }  # fmt: skip
        model, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
        session = spotrelay_session(model, checkpoint_dir=args.checkpoint_dir)
        stepper = None
    # every rank starts its clock together: rank 0's broadcast of the chosen step would otherwise wait
    # for the slowest rank's engine set-up, which is not resume time (and grows with the ranks per core)
    dist.barrier()
    if args.profile:  # where this rank's resume spends its time (``--profile``: the top entries per rank)
        import cProfile

        with cProfile.Profile() as prof:
            session.resume()
        prof.dump_stats(f"{args.out}.rank{dist.get_rank()}.prof")
    else:
        session.resume()
    for _ in session.steps(1):
        loss = model(torch.randn(4, args.width)).pow(2).mean()
        if stepper is None:
            model.backward(loss)
            model.step()
        else:
            stepper.zero_grad()
            loss.backward()
            stepper.step()
    session.close()
    rank = dist.get_rank()
    Path(f"{args.out}.rank{rank}.json").write_text(json.dumps({"resume_s": session.resume_seconds}))
    dist.destroy_process_group()


def _torchrun(nproc: int, engine: str, ckpt: Path, out: Path, width: int, layers: int,
             profile: bool = False) -> float | None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc), __file__,
           "--worker", "--engine", engine, "--checkpoint-dir", str(ckpt), "--out", str(out),
           "--width", str(width), "--layers", str(layers)] + (["--profile"] if profile else [])  # fmt: skip
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{engine} on {nproc} ranks failed:\n{done.stderr[-3000:]}")
    times = [json.loads(Path(f"{out}.rank{r}.json").read_text())["resume_s"] for r in range(nproc)]
    if profile:
        _print_profile(f"{engine} on {nproc} ranks", [Path(f"{out}.rank{r}.prof") for r in range(nproc)])
    return None if None in times else max(times)


def _print_profile(title: str, files: list[Path], top: int = 12) -> None:
    import pstats

    slowest = max(files, key=lambda f: pstats.Stats(str(f)).total_tt)  # type: ignore[attr-defined]
    print(f"--- profile: {title}, slowest rank ({slowest.name}) ---", flush=True)
    pstats.Stats(str(slowest)).sort_stats("cumulative").print_stats(top)


def run_all(engines: list[str], state_mb: float, width: int = 1024,
            profile: bool = False) -> dict[str, dict[int, float]]:
    layers = max(1, round(state_mb * 1e6 / (12 * (width * width + width))))  # fp32 weights + 2 Adam moments
    results: dict[str, dict[int, float]] = {}
    with tempfile.TemporaryDirectory(prefix="spotrelay-resize-") as tmp:
        for engine in engines:
            base = Path(tmp) / engine
            _torchrun(SAVE_WORLD, engine, base / "saved", base / "save", width, layers)
            results[engine] = {}
            for world in RESUME_WORLDS:
                ckpt = base / f"resume-{world}"
                shutil.copytree(base / "saved", ckpt)
                took = _torchrun(world, engine, ckpt, base / f"out-{world}", width, layers, profile)
                assert took is not None, f"{engine} on {world} ranks did not resume"
                results[engine][world] = took
            same = results[engine][SAVE_WORLD]
            others = ", ".join(
                f"{SAVE_WORLD}->{w}: {results[engine][w]:.3f} s = {results[engine][w] / same:.2f}x"
                for w in RESUME_WORLDS if w != SAVE_WORLD
            )  # fmt: skip
            print(f"{engine} ({layers} x Linear({width}, {width}) + AdamW, {state_mb:.0f} MB): "
                  f"same-size resume {same:.3f} s; {others}", flush=True)  # fmt: skip
    worst = max(results[e][w] / results[e][SAVE_WORLD] for e in results for w in RESUME_WORLDS if w != SAVE_WORLD)
    print(f"resume after resize / same-size resume: {worst:.2f}x at worst (target <= 1.5x)")
    return results


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--worker", action="store_true")
    p.add_argument("--engine", default="ddp")
    p.add_argument("--engines", default=ENGINES)
    p.add_argument("--checkpoint-dir", default=None)
    p.add_argument("--out", default=None)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--state-mb", type=float, default=60)
    p.add_argument("--profile", action="store_true", help="print where each resume spends its time (cProfile)")
    args = p.parse_args()
    if args.worker:
        worker(args)
    else:
        run_all(args.engines.split(","), args.state_mb, args.width, args.profile)


if __name__ == "__main__":
    main()
