"""A tiny transformer trained with the spotrelay training API (DeepSpeed ZeRO or torch DDP + DCP).

    torchrun --nproc_per_node 2 examples/tiny/train.py --engine deepspeed --steps 10 --out run.json

The global batch (``--global-batch``, default micro-batch x world) is kept on a resume at another
world size: it is read back from the checkpoint and each rank accumulates
``global_batch / (micro_batch x world)`` micro-batches per step (agent.batching). A ``--global-batch``
other than the checkpoint's is refused unless ``--allow-global-batch-change`` is given.

Reads SPOTRELAY_* from the environment (checkpoint dir/URI, control dir, intervals); flags give
defaults. ``--out`` gets, per rank, ``<out>.rank<R>.json`` with the losses of the steps this
process ran and a sha256 of the final parameters and optimizer state (for bit-identity checks).
``--stop-at K`` makes rank 0 write a checkpoint_and_stop request during step K-1, the way the
agent would, to exercise the coordinated stop. Each step's loss is the mean over the global batch
(all ranks, all micro-batches); ``samples`` lists the dataset indices each step used on this rank.
Health faults: ``--inject-nan-at K`` (step K's loss is NaN, once per process), ``--skip-data
STEP:N`` (the reference for a rollback), ``--slow-rank R`` (rank R lags every step, in the job's
first attempt only). ``--hold-rank R --hold-at K[@N]`` (repeatable): in attempt N (default 1), rank
R waits after step K until its agent asks it to stop, so a test's fault lands before the run can end
however slow the machine is.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from spotrelay.contracts.control import (  # noqa: E402
    ENV_ATTEMPT,
    ENV_CONTROL_DIR,
    RequestKind,
    StopRequest,
    read_request,
    write_request,
)
from spotrelay.errors import SpotrelayError  # noqa: E402
from spotrelay.training import GlobalBatchSampler, Session, plan_batch, spotrelay_session  # noqa: E402

VOCAB, SEQ = 64, 16


class TinyLM(nn.Module):
    def __init__(self, d_model: int = 32, layers: int = 2, heads: int = 2, dropout: float = 0.1) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, d_model)
        self.pos = nn.Parameter(torch.zeros(SEQ, d_model))
        block = nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, dropout=dropout, batch_first=True)
        self.body = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(tokens.shape[1])
        return self.head(self.body(self.embed(tokens) + self.pos, mask=mask, is_causal=True))


def lm_loss(model: Any, tokens: torch.Tensor) -> torch.Tensor:
    logits = model(tokens[:, :-1])
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


def tensor_digest(obj: Any, digest: Any) -> None:
    """Hash every tensor and number in a state tree, in a stable order."""
    if isinstance(obj, torch.Tensor):
        digest.update(obj.detach().cpu().contiguous().numpy().tobytes())
    elif isinstance(obj, dict):
        for key in sorted(obj, key=str):
            digest.update(str(key).encode())
            tensor_digest(obj[key], digest)
    elif isinstance(obj, list | tuple):
        for item in obj:
            tensor_digest(item, digest)
    elif isinstance(obj, int | float | bool | str) or obj is None:
        digest.update(repr(obj).encode())


def ds_batch(loader: DataLoader[Any]) -> dict[str, int]:
    """DeepSpeed's batch settings from the plan (its own checks then agree with ours)."""
    plan = loader.batch_sampler.plan  # type: ignore[union-attr]
    return {
        "train_batch_size": plan.global_batch, "train_micro_batch_size_per_gpu": plan.micro_batch,
        "gradient_accumulation_steps": plan.accumulation,
    }  # fmt: skip


def build(args: argparse.Namespace, loader: DataLoader[Any]) -> tuple[Any, Any, Any]:
    """(thing to step, optimizer for hashing, session)."""
    model = TinyLM(d_model=args.d_model, dropout=args.dropout)
    common = {"dataloader": loader, "checkpoint_dir": args.checkpoint_dir, "every_steps": args.every}
    if args.engine == "deepspeed":
        import deepspeed

        config = {
            **ds_batch(loader),
            "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01, "torch_adam": True}},
            "scheduler": {
                "type": "WarmupLR",
                "params": {"warmup_min_lr": 0, "warmup_max_lr": 3e-3, "warmup_num_steps": 5},
            },
            "zero_optimization": {"stage": args.zero_stage},
            "steps_per_print": 10**9,
        }  # fmt: skip
        engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
        return engine, optimizer, spotrelay_session(engine, **common)
    ddp: nn.Module = nn.parallel.DistributedDataParallel(model) if dist.is_initialized() else model
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=3e-3, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.2, total_iters=5)
    session = spotrelay_session(ddp, optimizer, lr_scheduler=scheduler, **common)
    return (ddp, optimizer, scheduler), optimizer, session


def seed_everything(seed: int) -> None:
    """One CPU thread (bit-exact reductions) and every RNG a run draws from."""
    torch.set_num_threads(1)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _global_mean(value: float) -> float:
    if not dist.is_initialized():
        return value
    total = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(total)
    return float(total.item()) / dist.get_world_size()


def run_steps(session: Session, stepper: Any, deepspeed: bool, args: argparse.Namespace, rank: int) -> Any:
    """The training loop: a DeepSpeed engine steps itself; otherwise (model, optimizer, scheduler).
    ``--stop-at k`` has rank 0 ask for checkpoint_and_stop during step k-1, as the agent would.
    Returns (step, global mean loss) and (step, this rank's sample indices) per step."""
    losses: list[tuple[int, float]] = []
    samples: list[tuple[int, list[int]]] = []
    accumulation, step_loss, seen = session.accumulation, 0.0, []
    # each step's loss as it happens, so a node killed mid-run still leaves what it computed
    progress = Path(f"{args.out}.rank{rank}.steps.jsonl") if getattr(args, "out", None) else None
    inject_nan = getattr(args, "inject_nan_at", None)
    skip_at, skip_n = getattr(args, "skip_data", None) or (None, 0)
    # a slow node in the first attempt only: its replacement is a healthy machine
    first_attempt = os.environ.get(ENV_ATTEMPT, "1") == "1"
    slow = getattr(args, "slow_s", 0.0) if rank == getattr(args, "slow_rank", None) and first_attempt else 0.0
    attempt, mine = int(os.environ.get(ENV_ATTEMPT) or 1), rank == getattr(args, "hold_rank", None)
    holds = {k for k, n in getattr(args, "hold_at", None) or () if mine and n == attempt}
    if skip_at == 0:
        session.skip_batches(skip_n)
    for step, micro, (tokens, index) in session.micro_steps(args.steps):
        last = micro == accumulation - 1
        if micro == 0:
            time.sleep(slow)  # a slow node: its data or its forward pass lags every step
        grad_norm = None
        if deepspeed:  # DeepSpeed divides by its gradient_accumulation_steps and steps on the last one
            loss = lm_loss(stepper, tokens)
            if step == inject_nan:
                loss, inject_nan = loss * float("nan"), None  # a transient fault: once per process
            stepper.backward(loss)
            stepper.step()
        else:
            model, opt, sched = stepper
            sync = nullcontext() if last or not hasattr(model, "no_sync") else model.no_sync()
            with sync:
                loss = lm_loss(model, tokens)
                if step == inject_nan:
                    loss, inject_nan = loss * float("nan"), None
                (loss / accumulation).backward()
            if last:
                grad_norm = nn.utils.clip_grad_norm_(model.parameters(), float("inf"))  # measures; clips nothing
                opt.step()
                sched.step()
                opt.zero_grad(set_to_none=True)
        step_loss += loss.item() / accumulation
        seen += index.tolist()
        if not last:
            continue
        session.step_done(step_loss, samples=tokens.shape[0] * accumulation, grad_norm=grad_norm)
        if skip_at is not None and step == skip_at - 1:
            session.skip_batches(skip_n)  # the reference for a rollback: the same data window, skipped
        losses.append((step, _global_mean(step_loss)))
        samples.append((step, seen))
        step_loss, seen = 0.0, []
        if progress is not None:
            with progress.open("a") as fh:
                fh.write(json.dumps(losses[-1]) + "\n")
        if args.stop_at is not None and step == args.stop_at - 1 and rank == 0:
            control = Path(os.environ[ENV_CONTROL_DIR])
            write_request(control, StopRequest(request_id=f"stop-{step}", kind=RequestKind.CHECKPOINT_AND_STOP,
                                               deadline=time.time() + 120, reason="test"))  # fmt: skip
        if step in holds:
            hold_until_stopped(Path(os.environ[ENV_CONTROL_DIR]))
        time.sleep(getattr(args, "step_sleep", 0.0))
    return losses, samples


def _hold(value: str) -> tuple[int, int]:
    step, _, attempt = value.partition("@")
    return int(step), int(attempt or 1)


def hold_until_stopped(control: Path) -> None:
    """Wait until the agent asks this rank to stop; the next step boundary then agrees on it."""
    while True:
        request = read_request(control)
        if request is not None and request.kind in (RequestKind.CHECKPOINT_AND_STOP, RequestKind.STOP):
            return
        time.sleep(0.1)


def make_loader(args: argparse.Namespace) -> DataLoader[Any]:
    """The tiny dataset (tokens, index) in the global order, this rank's micro-batches of each step."""
    data = torch.randint(0, VOCAB, (args.samples, SEQ + 1), generator=torch.Generator().manual_seed(7))
    dataset = TensorDataset(data, torch.arange(args.samples))
    plan = plan_batch(args.batch, args.global_batch, checkpoint_dir=args.checkpoint_dir,
                      allow_global_batch_change=getattr(args, "allow_global_batch_change", False) or None)
    return DataLoader(dataset, batch_sampler=GlobalBatchSampler(len(dataset), plan, seed=args.seed))


def add_common_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--batch", type=int, default=4, help="micro-batch per rank")
    p.add_argument("--global-batch", type=int, default=None, help="default: the checkpoint's, else batch x world")
    p.add_argument("--allow-global-batch-change", action="store_true",
                   help="resume with a --global-batch other than the checkpoint's (else refused)")
    p.add_argument("--samples", type=int, default=128, help="dataset size")
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--d-model", type=int, default=32, help="model width (another width is another model)")
    p.add_argument("--checkpoint-dir", default=None)
    p.add_argument("--every", type=int, default=None, help="checkpoint every N steps")
    p.add_argument("--stop-at", type=int, default=None)
    p.add_argument("--out", default=None)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--engine", choices=["deepspeed", "ddp"], default="ddp")
    p.add_argument("--zero-stage", type=int, default=2)
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--inject-nan-at", type=int, default=None, help="make step K's loss NaN (once per process)")
    p.add_argument("--skip-data", type=lambda v: tuple(int(x) for x in v.split(":")), default=None,
                   metavar="STEP:N", help="before STEP, drop N batches (what a rollback to STEP does)")
    p.add_argument("--slow-rank", type=int, default=None, help="in attempt 1, this rank sleeps --slow-s every step")
    p.add_argument("--slow-s", type=float, default=0.05)
    p.add_argument("--hold-rank", type=int, default=None, help="this rank waits after each --hold-at ...")
    p.add_argument("--hold-at", type=_hold, action="append", metavar="K[@N]",
                   help="... step K of attempt N (default 1) until its agent asks it to stop")
    add_common_args(p)
    args = p.parse_args()

    seed_everything(args.seed)
    if "WORLD_SIZE" in os.environ and not dist.is_initialized():
        if args.engine == "deepspeed":
            import deepspeed

            deepspeed.init_distributed(dist_backend="gloo")
        else:
            dist.init_process_group("gloo")
    rank = dist.get_rank() if dist.is_initialized() else 0

    stepper, optimizer, session = build(args, make_loader(args))
    losses, samples = run_steps(session, stepper, args.engine == "deepspeed", args, rank)
    code = session.close()
    if args.out:
        model_for_hash = stepper.module if args.engine == "deepspeed" else stepper[0]
        digest = hashlib.sha256()
        tensor_digest(model_for_hash.state_dict(), digest)
        tensor_digest(optimizer.state_dict(), digest)
        result = {"losses": losses, "samples": samples, "state_sha256": digest.hexdigest(), "exit": code}
        result.update(resumed_from=session.resumed_from, resume_seconds=session.resume_seconds)
        Path(f"{args.out}.rank{rank}.json").write_text(json.dumps(result))
    if dist.is_initialized():
        dist.destroy_process_group()
    return code


def cli(entry: Any) -> int:
    """A refusal (batch plan, incompatible checkpoint) is one line on stderr, exit code 1."""
    try:
        return int(entry())
    except SpotrelayError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(cli(main))
