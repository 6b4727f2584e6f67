"""Checks that a valid checkpoint fits this run, made before anything is loaded.

Each refusal is an IncompatibleCheckpointError naming the step folder, what differs and what to
do; nothing saved is changed (the run stops before its first step, so no save or pruning runs).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from agent.checkpoint.manifest import Manifest
from spotrelay.errors import IncompatibleCheckpointError

log = logging.getLogger("spotrelay.checkpoint")
ALLOW_SPEC_CHANGE_HINT = "set SPOTRELAY_ALLOW_SPEC_CHANGE=1 (allow_spec_change=True) to resume it anyway"
ALLOW_BATCH_CHANGE_HINT = (
    "set SPOTRELAY_ALLOW_GLOBAL_BATCH_CHANGE=1 (allow_global_batch_change=True; examples/tiny: "
    "--allow-global-batch-change) to start a new run definition from it"
)
ENGINE_NAMES = {"dcp": "torch DDP/FSDP (torch.distributed.checkpoint)", "deepspeed": "DeepSpeed"}


def check_manifest(
    manifest: Manifest, step_dir: Path, engine: str, spec_hash: str, code_hash: str, allow_spec_change: bool,
    training_hash: str = "",
) -> None:
    """The manifest's ``spec_hash`` is the training hash of the spec that saved it (spotrelay.spec.
    training_hash: the training definition); a checkpoint from before 5 December recorded the whole
    spec's hash. Either of this run's matching is the same run; neither is another one, refused unless
    allowed. (One field for both keeps older agents able to read newer manifests.)"""
    if manifest.engine != engine:
        saved, now = ENGINE_NAMES.get(manifest.engine, manifest.engine), ENGINE_NAMES.get(engine, engine)
        raise IncompatibleCheckpointError(
            f"{step_dir}: written by a {saved} session, this run is a {now} session; resume it with the "
            f"engine that wrote it, or give this run an empty checkpoint location"
        )
    ours = {h for h in (training_hash, spec_hash) if h}
    if manifest.spec_hash and ours and manifest.spec_hash not in ours:
        now = training_hash or spec_hash
        if not allow_spec_change:
            raise IncompatibleCheckpointError(
                f"{step_dir}: saved under spec {manifest.spec_hash[:12]}, this run's is {now[:12]} (its training "
                f"definition: entrypoint, launcher, dataset); resume with the spec that wrote it, or "
                f"{ALLOW_SPEC_CHANGE_HINT}"
            )
        log.warning("resuming %s saved under spec %s, now %s (allowed)", step_dir, manifest.spec_hash[:12], now[:12])
    if manifest.code_hash and code_hash and manifest.code_hash != code_hash:  # code fixes are normal: warn
        log.warning("resuming %s saved by another script (%s, now %s)", step_dir, manifest.code_hash, code_hash)
    layout = manifest.layout or {}
    for axis in ("tp", "pp"):
        if int(layout.get(axis, 1)) != 1:
            raise IncompatibleCheckpointError(
                f"{step_dir}: saved with {axis}={layout[axis]}; only the data-parallel size may change on resume"
            )


def check_global_batch(where: str | Path, recorded: int | None, asked: int | None, allowed: bool) -> None:
    """The global batch defines the run (the data order's steps, what the LR schedule's steps mean):
    another one than the checkpoint's is refused unless the run opted in, and then logged."""
    if recorded is None or asked is None or recorded == asked:
        return
    if not allowed:
        raise IncompatibleCheckpointError(
            f"{where}: trained with global batch {recorded}, this run asks for {asked}; resume without a global "
            f"batch to keep {recorded} (any world size that divides it), or {ALLOW_BATCH_CHANGE_HINT}"
        )
    log.warning("resuming %s with global batch %d, trained with %d (allowed): the data order goes on from the "
                "saved sample cursor, the LR schedule by optimizer step", where, asked, recorded)  # fmt: skip


def check_parameters(step_dir: Path, saved: dict[str, tuple[int, ...]], live: dict[str, tuple[int, ...]]) -> None:
    """Same parameter names and shapes (global shapes: sharding does not count)."""
    missing = sorted(set(saved) - set(live))
    extra = sorted(set(live) - set(saved))
    shapes = sorted(k for k in set(saved) & set(live) if tuple(saved[k]) != tuple(live[k]))
    if not (missing or extra or shapes):
        return
    parts = []
    if missing:
        parts.append(f"the model has no {_few(missing)} (saved)")
    if extra:
        parts.append(f"the checkpoint has no {_few(extra)} (in the model)")
    if shapes:
        differ = [f"{k} saved {tuple(saved[k])}, now {tuple(live[k])}" for k in shapes[:3]]
        more = f" and {len(shapes) - 3} more" if len(shapes) > 3 else ""
        parts.append("shapes differ: " + ", ".join(differ) + more)
    raise IncompatibleCheckpointError(
        f"{step_dir}: another model: " + "; ".join(parts)
        + "; resume it with the model that wrote it, or give this run an empty checkpoint location"
    )  # fmt: skip


def check_optimizer(step_dir: Path, saved: set[str], live: dict[str, Any]) -> None:
    """The same kind of optimizer: the same per-parameter state names (Adam's ``exp_avg``, SGD's
    ``momentum_buffer``) and the hyper-parameters this one needs. ``saved``: the checkpoint's
    flattened ``optim.*`` keys (DCP); ``live``: this optimizer's state dict (``get_state_dict``)."""
    saved_state = {key.rsplit(".", 1)[1] for key in saved if key.startswith("optim.state.")}
    saved_groups = {key.split(".")[3] for key in saved if key.startswith("optim.param_groups.")}
    check_optimizer_names(step_dir, (saved_state, saved_groups), optimizer_names(live))


def optimizer_names(state_dict: dict[str, Any]) -> tuple[set[str], set[str]]:
    """(per-parameter state names, param-group keys) of an optimizer state dict."""
    state = {name for per_param in state_dict.get("state", {}).values() for name in per_param}
    return state, {name for group in state_dict.get("param_groups", []) for name in group}


def check_optimizer_names(step_dir: Path, saved: tuple[set[str], set[str]], live: tuple[set[str], set[str]]) -> None:
    """Refuse another optimizer: other state names, or hyper-parameters the saved groups lack."""
    (saved_state, saved_groups), (live_state, live_groups) = saved, live
    parts = []
    if live_state - saved_state:
        parts.append(f"the checkpoint has no optimizer state {_few(sorted(live_state - saved_state))}")
    if live_state and saved_state - live_state:  # an optimizer with no state yet cannot tell
        parts.append(f"this optimizer keeps no {_few(sorted(saved_state - live_state))} (saved)")
    if live_groups - saved_groups:
        parts.append(f"the saved param groups have no {_few(sorted(live_groups - saved_groups))}")
    if parts:
        raise IncompatibleCheckpointError(
            f"{step_dir}: another optimizer: " + "; ".join(parts)
            + "; resume it with the optimizer that wrote it, or give this run an empty checkpoint location"
        )  # fmt: skip


def _few(names: list[str]) -> str:
    shown = ", ".join(names[:3])
    return shown + (f" and {len(names) - 3} more" if len(names) > 3 else "")
