"""examples/tiny's transformer trained with fully sharded state: DeepSpeed ZeRO-3 or torch FSDP2 + DCP.

    torchrun --nproc_per_node 2 tests/integration/sharded_train.py --engine zero3 --steps 8 --out run

Same contract as examples/tiny/train.py (``<out>.rank<R>.json`` with losses, exit code, resumed_from,
``--stop-at K`` writes a checkpoint_and_stop request during step K-1 on rank 0), but the digest must see
through the sharding: ``params_sha256`` hashes the gathered full parameters (identical on every rank),
``optim_sha256`` hashes this rank's optimizer shard (comparable rank to rank between runs).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "examples" / "tiny")]

from train import (  # noqa: E402
    TinyLM,
    add_common_args,
    cli,
    ds_batch,
    make_loader,
    run_steps,
    seed_everything,
    tensor_digest,
)

from spotrelay.training import spotrelay_session  # noqa: E402

LR = 3e-3


def _sha(obj: Any) -> str:
    digest = hashlib.sha256()
    tensor_digest(obj, digest)
    return digest.hexdigest()


def build_zero3(args: argparse.Namespace, loader: DataLoader[Any]) -> tuple[Any, Any]:
    import deepspeed
    from deepspeed.utils import set_z3_leaf_modules

    model = TinyLM(d_model=args.d_model, dropout=args.dropout)
    # MultiheadAttention reads out_proj's weight without calling out_proj: gather it as one leaf
    set_z3_leaf_modules(model, [torch.nn.MultiheadAttention])
    config = {
        **ds_batch(loader),
        "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.01, "torch_adam": True}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": LR, "warmup_num_steps": 5}},
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
        "steps_per_print": 10**9,
    }  # fmt: skip
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    session = spotrelay_session(engine, dataloader=loader, checkpoint_dir=args.checkpoint_dir, every_steps=args.every)
    return engine, session


def digest_zero3(engine: Any) -> dict[str, str]:
    import deepspeed

    params = dict(engine.module.named_parameters())
    with deepspeed.zero.GatheredParameters(list(params.values()), modifier_rank=None):
        full = {name: p.detach().clone() for name, p in params.items()}
    assert all(t.numel() > 0 for t in full.values()), "ZeRO-3 gather returned empty parameters"
    optim = engine.optimizer.state_dict()  # this rank's fp32 partition and its Adam moments
    return {"params_sha256": _sha(full), "optim_sha256": _sha(optim), "numel": sum(t.numel() for t in full.values())}


def build_fsdp(args: argparse.Namespace, loader: DataLoader[Any]) -> tuple[Any, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = TinyLM(d_model=args.d_model, dropout=args.dropout)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model.body.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.2, total_iters=5)
    session = spotrelay_session(
        model, optimizer, lr_scheduler=scheduler, dataloader=loader, checkpoint_dir=args.checkpoint_dir,
        every_steps=args.every,
    )  # fmt: skip
    return (model, optimizer, scheduler), session


def digest_fsdp(stepper: Any) -> dict[str, Any]:
    from torch.distributed.tensor import DTensor

    model, optimizer, _ = stepper
    assert all(isinstance(p, DTensor) for p in model.parameters()), "FSDP2 did not shard the parameters"
    full = {name: p.full_tensor() for name, p in model.named_parameters()}
    local = {  # this rank's Adam moments, keyed by parameter name
        name: {k: v.to_local() if isinstance(v, DTensor) else v for k, v in optimizer.state[p].items()}
        for name, p in model.named_parameters()
    }
    assert all(local.values()), "the optimizer has no state for some parameter"
    return {"params_sha256": _sha(full), "optim_sha256": _sha(local), "numel": sum(t.numel() for t in full.values())}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--engine", choices=["zero3", "fsdp"], required=True)
    add_common_args(p)
    args = p.parse_args()

    seed_everything(args.seed)
    if args.engine == "zero3":
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo")
    else:
        dist.init_process_group("gloo")
    rank = dist.get_rank()

    stepper, session = (build_zero3 if args.engine == "zero3" else build_fsdp)(args, make_loader(args))

    losses, samples = run_steps(session, stepper, args.engine == "zero3", args, rank)
    code = session.close()
    result: dict[str, Any] = digest_zero3(stepper) if args.engine == "zero3" else digest_fsdp(stepper)
    result.update(losses=losses, samples=samples, exit=code, resumed_from=session.resumed_from)
    result.update(resume_seconds=session.resume_seconds)
    Path(f"{args.out}.rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(cli(main))
