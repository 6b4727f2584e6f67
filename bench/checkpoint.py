"""Checkpoint benchmark: training stall, background overhead and emergency flush, side by side.

    .venv/bin/python bench/checkpoint.py            # ~300 MB of state, ~3-5 minutes on 2 cores

Trains an MLP whose parameters plus AdamW state are >= 256 MB through the spotrelay training API
(torch path: DCP with our arena storage, local tier, S3 = moto's server in its own process at
nice 19 unless ``--moto-nice`` says otherwise). It interleaves blocks of
steps without checkpoints and blocks with one checkpoint each (``--every`` steps), so both see the
same machine load, then sends a checkpoint_and_stop request and times it to the committed manifest
in S3. Baselines, measured in the same run on the same bytes: an in-memory copy (memcpy) of the
state, and a plain parallel multipart upload (boto3's transfer manager) to the same endpoint.
Ends with one line per ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from spotrelay.contracts.control import RequestKind, StopRequest, read_events, write_request  # noqa: E402
from spotrelay.local.motoserver import FAKE_ENV, free_port  # noqa: E402
from spotrelay.training import Session, spotrelay_session  # noqa: E402

MB = 1e6


def start_moto(nice: int = 0) -> tuple[subprocess.Popen[bytes], str]:
    """moto in its own process, so its request handling does not share our GIL.

    ``nice``: moto stands in for S3, a remote service whose work is not on a real training node;
    at nice 19 it gets only the cycles training leaves (every thread it starts inherits this).
    """
    port = free_port()
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=lambda: os.nice(nice) and None,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    os.environ.update({**FAKE_ENV, "AWS_ENDPOINT_URL": url})
    from spotrelay.settings import reset

    reset()
    import requests

    for _ in range(100):
        try:
            requests.get(f"{url}/moto-api/", timeout=1)
            return proc, url
        except requests.ConnectionError:
            time.sleep(0.1)
    raise RuntimeError("moto_server did not start")


def state_tensors(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    found = [p.data for p in model.parameters()]
    for state in optimizer.state.values():
        found += [v for v in state.values() if isinstance(v, torch.Tensor)]
    return found


def memcpy_seconds(tensors: list[torch.Tensor]) -> float:
    """Best of 3: copying the same bytes into already-allocated memory."""
    dst = [torch.empty_like(t) for t in tensors]
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for d, s in zip(dst, tensors, strict=True):
            d.copy_(s)
        best = min(best, time.perf_counter() - t0)
    return best


def plain_upload_seconds(files: list[Path], bucket: str, prefix: str, workers: int, part: int) -> float:
    from boto3.s3.transfer import TransferConfig
    from s3transfer.manager import TransferManager

    from spotrelay.adapters import aws

    config = TransferConfig(multipart_threshold=part, multipart_chunksize=part, max_concurrency=workers)
    t0 = time.perf_counter()
    with TransferManager(aws.client("s3"), config) as manager:
        futures = [manager.upload(str(f), bucket, f"{prefix}/{i}-{f.name}") for i, f in enumerate(files)]
        for fut in futures:
            fut.result()
    return time.perf_counter() - t0


def last_checkpoint_files(session: Session) -> list[Path]:
    step = session.local.latest()
    assert step is not None
    return [session.local.step_dir(step) / s.path for s in session.local.manifest(step).shards]


def block_means(none: list[float], ckpt: list[float], block: int) -> dict[str, list[float]]:
    """Mean step time of each block, to show how much blocks of the same kind differ."""

    def means(xs: list[float]) -> list[float]:
        return [round(statistics.mean(xs[i : i + block]), 4) for i in range(0, len(xs), block) if xs[i : i + block]]

    return {"none": means(none), "ckpt": means(ckpt)}


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: int, width: int) -> float:
    x = torch.randn(batch, width)
    optimizer.zero_grad(set_to_none=True)
    loss = (model(x) - x).pow(2).mean()
    loss.backward()
    optimizer.step()
    return float(loss)


def mlp(width: int, layers: int) -> nn.Module:
    return nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(layers)])


def build_torch(args: argparse.Namespace, options: dict[str, Any]) -> tuple[Session, Any, Any]:
    """Plain torch + AdamW: state = parameters + 2 moments (3 copies of the parameters)."""
    width = args.width
    layers = args.layers = max(1, round(args.state_mb * MB / (3 * 4 * (width * width + width))))
    model = mlp(width, layers)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    session = spotrelay_session(model, optimizer, **options)
    return session, lambda: train_step(model, optimizer, args.batch, width), lambda: state_tensors(model, optimizer)


def build_deepspeed(args: argparse.Namespace, options: dict[str, Any]) -> tuple[Session, Any, Any]:
    """DeepSpeed ZeRO-2, one gloo rank: state = parameters, fp32 partition and 2 moments (4 copies)."""
    import deepspeed

    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0", "WORLD_SIZE": "1"})
    os.environ.update({"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"})
    deepspeed.init_distributed(dist_backend="gloo")
    width = args.width
    layers = args.layers = max(1, round(args.state_mb * MB / (4 * 4 * (width * width + width))))
    config = {
        "train_micro_batch_size_per_gpu": args.batch, "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
        "zero_optimization": {"stage": 2}, "steps_per_print": 10**9,
    }  # fmt: skip
    model = mlp(width, layers)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    session = spotrelay_session(engine, **options)

    def step() -> float:
        x = torch.randn(args.batch, width)
        loss = (engine(x) - x).pow(2).mean()
        engine.backward(loss)
        engine.step()
        return float(loss)

    return session, step, lambda: flat_state(session)


def flat_state(session: Session) -> list[torch.Tensor]:
    """DeepSpeed's state is spread over its internals: a flat buffer as large as the checkpoint
    (one ``copy_`` of it is the fastest way to copy those bytes: the strictest baseline)."""
    step = session.local.latest()
    assert step is not None
    return [torch.ones(session.local.manifest(step).total_bytes, dtype=torch.uint8)]


def run(args: argparse.Namespace, work: Path, bucket: str) -> dict[str, Any]:
    torch.manual_seed(0)
    control = work / "control"
    options = {
        "checkpoint_dir": work / "ckpt", "checkpoint_uri": f"s3://{bucket}/checkpoints/bench",
        "control_dir": control, "keep_local": 2, "keep_s3": 2, "save_final": False,
        "notice_training": False,  # time the flush itself: stop at the request, as the final save does
    }  # fmt: skip
    build = build_deepspeed if args.engine == "deepspeed" else build_torch
    session, train, tensors_now = build(args, options)
    session.config.every_steps = None
    block, warmup = args.every, 3
    total = warmup + 2 * block * args.rounds + 1
    times: dict[str, list[float]] = {"none": [], "ckpt": []}
    stalls: list[float] = []
    emergency_at: float | None = None
    upload_before = 0.0
    last = time.perf_counter()
    for step, _ in session.steps(total):
        now = time.perf_counter()
        if warmup < step < total - 1:  # the time since the last yield: the step before plus its boundary
            index = (step - 1 - warmup) // block
            times["ckpt" if index % 2 else "none"].append(now - last)
        last = now
        train()
        rel = step - warmup
        if rel >= 0 and rel < 2 * block * args.rounds and (rel // block) % 2 == 1 and rel % block == 0:
            session.request_checkpoint()  # the first step of every checkpoint block saves
        if step == total - 2:
            session.pipeline.flush()  # the emergency save starts with an idle pipeline
            before = last_checkpoint_files(session)  # baseline right before the flush, same size
            assert session.s3 is not None
            upload_before = plain_upload_seconds(before, bucket, "plain-1", session.s3.workers, session.s3.part_size)
        if step == total - 1:
            request = StopRequest(request_id="bench", kind=RequestKind.CHECKPOINT_AND_STOP, deadline=time.time() + 120)
            emergency_at = time.time()
            write_request(control, request)
        job = session.last_job
        if job is not None and "snapshot_s" in job.timings and not job.emergency and job.step == step:
            stalls.append(job.timings["snapshot_s"])
    events, _ = read_events(control)
    emergency = next(e for e in events if e.emergency)
    assert emergency_at is not None
    flush_s = emergency.time - emergency_at
    assert session.last_job is not None and session.last_job.emergency
    phases = {k: round(v, 3) for k, v in session.last_job.timings.items()}
    step_dir = session.local.step_dir(emergency.step)
    manifest = session.local.manifest(emergency.step)
    files = [step_dir / s.path for s in manifest.shards]
    tensors = tensors_now()
    state_bytes = sum(t.numel() * t.element_size() for t in tensors)
    memcpy_s = memcpy_seconds(tensors)
    assert session.s3 is not None
    upload_after = plain_upload_seconds(files, bucket, "plain-2", session.s3.workers, session.s3.part_size)
    upload_s = (upload_before + upload_after) / 2  # before and after the flush: load drift cancels
    code = session.close()
    return {
        "engine": args.engine, "layers": args.layers, "width": args.width, "state_bytes": state_bytes,
        "checkpoint_bytes": manifest.total_bytes,
        "step_none_s": statistics.median(times["none"]), "step_ckpt_s": statistics.mean(times["ckpt"]),
        "step_none_mean_s": statistics.mean(times["none"]), "stall_s": statistics.median(stalls),
        "memcpy_s": memcpy_s, "flush_s": flush_s, "plain_upload_s": upload_s, "exit_code": code,
        "plain_upload_before_after_s": [upload_before, upload_after],
        "checkpoints": len(stalls), "emergency_phases": phases, "loadavg": os.getloadavg(),
        "block_means_s": block_means(times["none"], times["ckpt"], block),
    }  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--state-mb", type=float, default=300, help="parameters + AdamW state, MB")
    p.add_argument("--engine", choices=["torch", "deepspeed"], default="torch", help="DCP or DeepSpeed ZeRO-2")
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--batch", type=int, default=80)
    p.add_argument("--every", type=int, default=50, help="steps per block (one checkpoint per block)")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--threads", type=int, default=1, help="torch threads for training (others stay free)")
    p.add_argument(
        "--moto-nice", type=int, default=19, help="CPU priority of moto's server (0: competes with training)"
    )
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--resize", action="store_true", help="time resumes at other world sizes instead (bench/resize.py)")
    p.add_argument("--engines", default="ddp,fsdp2,zero2,zero3", help="with --resize")
    args = p.parse_args()
    if args.resize:
        from resize import run_all  # bench/resize.py, next to this file

        run_all(args.engines.split(","), args.state_mb if args.state_mb != 300 else 60)
        return
    torch.set_num_threads(args.threads)
    proc, _url = start_moto(args.moto_nice)
    try:
        from spotrelay.adapters import aws

        bucket = "spotrelay-bench"
        aws.client("s3").create_bucket(Bucket=bucket)
        with tempfile.TemporaryDirectory(prefix="spotrelay-bench-") as tmp:
            r = run(args, Path(tmp), bucket)
    finally:
        proc.terminate()
        proc.wait(10)
    stall_ratio = r["stall_s"] / r["memcpy_s"]
    overhead = r["step_ckpt_s"] / r["step_none_mean_s"] - 1
    flush_ratio = r["flush_s"] / r["plain_upload_s"]
    state_mb, files_mb = r["state_bytes"] / MB, r["checkpoint_bytes"] / MB
    print(f"{r['engine']}: checkpointed state {state_mb:.1f} MB; checkpoint files {files_mb:.1f} MB")
    print(f"model: {r['layers']} x Linear({r['width']}, {r['width']}); step {r['step_none_s']:.3f} s (median)")
    print(f"stall per checkpoint {r['stall_s']:.3f} s (median of {r['checkpoints']}); memcpy {r['memcpy_s']:.3f} s")
    print(
        f"mean step: none {r['step_none_mean_s']:.4f} s, one checkpoint per {args.every} steps {r['step_ckpt_s']:.4f} s"
    )
    print(f"block means (s): none {r['block_means_s']['none']}, with a checkpoint {r['block_means_s']['ckpt']}")
    b, a = r["plain_upload_before_after_s"]
    print(f"emergency flush {r['flush_s']:.2f} s; plain parallel multipart upload {b:.2f} s before, {a:.2f} s after")
    print(f"emergency phases (s, cumulative from the save): {r['emergency_phases']}")
    one, five, fifteen = r["loadavg"]
    cores = os.cpu_count()
    print(
        f"load average at the end: {one:.1f} {five:.1f} {fifteen:.1f} on {cores} cores; moto at nice {args.moto_nice}"
    )
    if args.json:
        args.json.write_text(json.dumps(r, indent=1))
    print(f"stall/memcpy ratio: {stall_ratio:.2f}x (target <= 2x)")
    print(f"periodic checkpoint step overhead: {overhead * 100:.2f}% (target <= 3%)")
    print(f"emergency flush/plain upload ratio: {flush_ratio:.2f}x (target <= 1.3x)")


if __name__ == "__main__":
    main()
