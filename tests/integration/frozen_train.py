"""examples/tiny's transformer fine-tuned the way people fine-tune: part of it frozen, and state in a buffer.

    torchrun --nproc_per_node 2 tests/integration/frozen_train.py --zero-stage 2 --steps 6 --every 3 --out run

On DeepSpeed (ZeRO stage 0-3), or DDP (``--engine ddp``). The embedding is frozen (``requires_grad``
off). A persistent buffer (``seen``: samples trained on, all ranks together) sets a temperature on the
logits, so the losses depend on it. ``--init-seed`` builds the model from another seed (a process whose
code initializes otherwise): only a restore that brings back the frozen weights and the buffer gives
the straight run's losses. Same output contract as examples/tiny/train.py (``<out>.rank<R>.json``:
losses, exit, resumed_from).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "examples" / "tiny")]

from train import TinyLM, add_common_args, cli, ds_batch, make_loader, run_steps, seed_everything  # noqa: E402

from spotrelay.training import spotrelay_session  # noqa: E402


class FrozenTiny(nn.Module):
    def __init__(self, d_model: int, per_forward: int, global_batch: int) -> None:
        super().__init__()
        self.lm = TinyLM(d_model=d_model, dropout=0.0)
        self.lm.embed.weight.requires_grad_(False)
        self.per_forward, self.global_batch = per_forward, global_batch  # world x micro-batch; samples a step
        self.register_buffer("seen", torch.randint(0, 10, (), dtype=torch.float64) * global_batch)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(tokens.shape[1])
        logits = self.lm.head(self.lm.body(self.lm.embed(tokens) + self.lm.pos, mask=mask, is_causal=True))
        # a temperature from the steps trained (whole steps: every micro-batch of a step, at any world
        # size, sees the same), so the losses depend on the buffer
        out = logits / (1.0 + float(self.seen // self.global_batch) / 10.0)
        if self.training:
            self.seen += self.per_forward  # each step adds the global batch on every rank
        return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--engine", choices=["deepspeed", "ddp"], default="deepspeed")
    p.add_argument("--zero-stage", type=int, default=2)
    p.add_argument("--tie", action="store_true", help="the head's weight is the embedding's")
    p.add_argument("--train-embedding", action="store_true", help="nothing frozen (the buffer stays)")
    p.add_argument("--init-seed", type=int, default=None, help="the model's initial values (default: --seed)")
    add_common_args(p)
    args = p.parse_args()
    seed_everything(args.seed)
    if args.engine == "ddp":
        dist.init_process_group("gloo")
    else:
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    loader = make_loader(args)
    plan = loader.batch_sampler.plan  # type: ignore[union-attr]
    with torch.random.fork_rng():
        torch.manual_seed(args.seed if args.init_seed is None else args.init_seed)
        model = FrozenTiny(args.d_model, world * plan.micro_batch, plan.global_batch)
    if args.train_embedding:
        model.lm.embed.weight.requires_grad_(True)
    if args.tie:  # one tensor under two names: the state dict has both, the parameters the first
        model.lm.head.weight = model.lm.embed.weight
    trainable = [q for q in model.parameters() if q.requires_grad]
    common = {"dataloader": loader, "checkpoint_dir": args.checkpoint_dir, "every_steps": args.every}
    if args.engine == "ddp":  # (DCP: the state dict holds every tensor; the optimizer, the trainable ones)
        ddp = nn.parallel.DistributedDataParallel(model)
        optimizer = torch.optim.AdamW(trainable, lr=3e-3, weight_decay=0.01)
        scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.2, total_iters=5)
        session = spotrelay_session(ddp, optimizer, lr_scheduler=scheduler, **common)
        return _run(session, (ddp, optimizer, scheduler), False, args, rank, model)
    if args.zero_stage == 3:
        from deepspeed.utils import set_z3_leaf_modules

        set_z3_leaf_modules(model, [torch.nn.MultiheadAttention])  # (as sharded_train.py)
    config = {
        **ds_batch(loader),
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01, "torch_adam": True}},
        "zero_optimization": {"stage": args.zero_stage, "stage3_param_persistence_threshold": 0},
        "steps_per_print": 10**9,
    }  # fmt: skip
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=trainable, config=config)
    return _run(spotrelay_session(engine, **common), engine, True, args, rank, model)


def _run(session: Any, stepper: Any, deepspeed: bool, args: argparse.Namespace, rank: int, model: FrozenTiny) -> int:
    losses, samples = run_steps(session, stepper, deepspeed, args, rank)
    code = session.close()
    result: dict[str, Any] = {"losses": losses, "samples": samples, "exit": code, "resumed_from": session.resumed_from,
                              "seen": float(model.seen)}
    Path(f"{args.out}.rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(cli(main))
