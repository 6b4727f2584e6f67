"""Checks that spare a launch: what would only fail on the nodes, after capacity was paid for.

The models check each field's shape; these check what a launch needs from the spec as a whole
(the script lies inside the working directory, the DeepSpeed config leaves spotrelay's parts to
spotrelay and agrees with the gang size, nothing the process launch refuses). Each problem is a
(field path, message) pair, like the model's own errors.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Sequence
from typing import Any

from spotrelay.spec.models import JobSpec

MAX_DEEPSPEED_CONFIG_BYTES = 64 * 1024

# Set per rank by torchrun / the DeepSpeed launcher; a value from the spec would break rendezvous.
LAUNCHER_ENV = frozenset({"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
                          "MASTER_ADDR", "MASTER_PORT", "CROSS_RANK", "CROSS_SIZE"})


def agent_env() -> frozenset[str]:
    """Set by the agent for the training API (agent/launcher.contract_env), over anything the spec says."""
    from spotrelay.contracts import control  # lazy: the spec loads without the contracts
    from spotrelay.contracts.health import ENV_HEALTH

    return frozenset({
        control.ENV_CONTROL_DIR, control.ENV_JOB_ID, control.ENV_ATTEMPT, control.ENV_CHECKPOINT_DIR,
        control.ENV_CHECKPOINT_URI, control.ENV_SPEC_HASH, control.ENV_CHECKPOINT_EVERY_STEPS,
        control.ENV_CHECKPOINT_EVERY_MINUTES, control.ENV_KEEP_LOCAL, control.ENV_KEEP_S3, control.ENV_MLFLOW_RUN_ID,
        control.ENV_TRAINING_HASH, control.ENV_DEEPSPEED_CONFIG, control.ENV_CHECKPOINT_LOSS_INTERVAL_S,
        control.ENV_CHECKPOINT_AUTO_MIN_MINUTES, control.ENV_CHECKPOINT_AUTO_MAX_MINUTES, ENV_HEALTH,
    })


# DeepSpeed config sections that would take over what spotrelay does itself.
RESERVED_DEEPSPEED = {
    "checkpoint": "spotrelay saves and resumes checkpoints itself; set checkpoint.* in the spec instead",
    "nebula": "spotrelay's checkpoint engine saves checkpoints; remove it",
    "elasticity": "spotrelay sizes the gang (resources.nodes); remove it",
}

Problems = list[tuple[str, str]]
IAM_PATTERN_CHARS = ("*", "?", "$")  # a wildcard or a policy variable in an IAM resource


def iam_pattern(place: str) -> bool:
    """Whether ``place`` holds what an IAM resource reads as a wildcard or a policy variable."""
    return any(c in place for c in IAM_PATTERN_CHARS)


def _pattern_problem(field: str, place: str, reach: str) -> tuple[str, str]:
    return (field, f"{place!r} holds one of {' '.join(IAM_PATTERN_CHARS)}, which the node's IAM policy would "
                   f"read as a pattern{reach}; name a plain prefix")


def inside(path: str) -> str | None:
    """Why ``path`` is not a relative path that stays inside the working directory, or None."""
    if path.startswith(("/", "~")) or (len(path) > 1 and path[1] == ":"):
        return "must be relative to entrypoint.working_dir"
    normal = posixpath.normpath(path.replace("\\", "/"))
    if normal == ".." or normal.startswith("../"):
        return "leaves entrypoint.working_dir ('..'); keep the path inside it"
    return None


def _nul(values: dict[str, str]) -> Problems:
    return [(path, "contains a NUL character, which no process launch accepts")
            for path, value in values.items() if "\x00" in value]


def entrypoint_problems(spec: JobSpec) -> Problems:
    entry = spec.entrypoint
    problems: Problems = []
    if entry.script is not None and (why := inside(entry.script)):
        problems.append(("entrypoint.script", why))
    strings = {"entrypoint.working_dir": entry.working_dir}
    if entry.script is not None:
        strings["entrypoint.script"] = entry.script
    strings.update({f"entrypoint.command[{i}]": v for i, v in enumerate(entry.command or [])})
    strings.update({f"entrypoint.args[{i}]": v for i, v in enumerate(entry.args)})
    strings.update({f"entrypoint.env.{k}": v for k, v in entry.env.items()})
    problems += _nul(strings)
    reserved = agent_env() if entry.env else frozenset()
    for name in entry.env:
        if name in reserved:
            problems.append((f"entrypoint.env.{name}", "is set by the agent (from the spec and the job)"))
        elif name in LAUNCHER_ENV:
            problems.append((f"entrypoint.env.{name}", "is set per rank by the launcher"))
    return problems


CODE_ARCHIVE = re.compile(r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/.+\.(tar\.gz|tgz)$")
CONTENT_ADDRESSED = re.compile(r"(?:^|/)([0-9a-f]{64})\.tar\.gz$")


def code_problems(spec: JobSpec) -> Problems:
    entry = spec.entrypoint
    if entry.code is None:
        return [("entrypoint.code_sha256", "goes with entrypoint.code")] if entry.code_sha256 else []
    problems: Problems = []
    if entry.code.startswith("s3://"):
        if not CODE_ARCHIVE.match(entry.code):
            problems.append(("entrypoint.code", "must be an s3://bucket/key.tar.gz archive"))
        named = CONTENT_ADDRESSED.search(entry.code)
        if named and entry.code_sha256 and named.group(1) != entry.code_sha256:
            problems.append(("entrypoint.code_sha256", "differs from the sha256 in the archive's name"))
    if (why := inside(entry.working_dir)) is not None and entry.working_dir != ".":
        problems.append(("entrypoint.working_dir", why.replace("entrypoint.working_dir", "the unpacked code")))
    return problems


def dropped_problems(spec: JobSpec) -> Problems:
    """What only a spec dropped in S3 cannot have: the controller cannot read the user's disk."""
    code = spec.entrypoint.code
    if code is not None and not code.startswith("s3://"):
        return [("entrypoint.code", "is a local path; `spotrelay submit` packs and uploads it, a spec dropped "
                                    "in S3 must name an s3:// .tar.gz archive")]
    return []


def checkpoint_place_problems(spec: JobSpec, roots: Sequence[str]) -> Problems:
    """A ``checkpoint.s3_prefix`` under none of ``roots`` (``s3://bucket/checkpoints/``: where the
    deployment's nodes may write at all) would fail on its first save, after paying for a gang: refused
    at submission instead. No roots (the twin, which enforces no IAM): not checked."""
    prefix = spec.checkpoint.s3_prefix
    if not prefix or not roots:
        return []
    if iam_pattern(prefix):
        return [_pattern_problem("checkpoint.s3_prefix", prefix, " (other jobs' checkpoints)")]
    if any(prefix.startswith(r) and prefix.rstrip("/") != r.rstrip("/") for r in roots):
        return []
    where = " or ".join(f"{r}<name>/" for r in roots)
    return [("checkpoint.s3_prefix", f"{prefix} is outside what this deployment's nodes may write; use {where}")]


def dataset_places(spec: JobSpec) -> list[tuple[str, str]]:
    """(field, S3 place) the job's training reads its data from: ``dataset.uri`` and each replica."""
    if spec.dataset is None:
        return []
    return [("dataset.uri", spec.dataset.uri),
            *((f"dataset.replicas.{region}", uri) for region, uri in spec.dataset.replicas.items())]


def dataset_uris(spec: JobSpec) -> list[str]:
    return [uri for _, uri in dataset_places(spec)]


def dataset_place_problems(spec: JobSpec, roots: Sequence[str]) -> Problems:
    """A ``dataset.uri`` or replica under none of ``roots`` (the data buckets' ``data/`` and the buckets
    the deployment lists in ``dataset_buckets``) is one the nodes may not read: the training would fail
    on its first read, after paying for a gang. No roots (the twin, which enforces no IAM): not checked."""
    if not roots:
        return []
    where = " or ".join(f"{r}..." for r in roots)
    problems: Problems = []
    for field, uri in dataset_places(spec):
        if iam_pattern(uri):
            problems.append(_pattern_problem(field, uri, ""))
        elif not any(uri.startswith(r) or uri.rstrip("/") + "/" == r for r in roots):
            problems.append((field, f"{uri} is not where this deployment's nodes may read: use {where} (deploy.md: "
                                    "the dataset_buckets context key lists your own buckets)"))
    return problems


def pattern_problems(spec: JobSpec) -> Problems:
    """A place the nodes' IAM policy names (``dataset.uri``, its replicas, ``checkpoint.s3_prefix``) that
    holds a wildcard or a policy variable: it would grant a pattern. Needs no deployment's buckets, so every
    spec read says it, ``spotrelay validate`` too (it was the submission handler's alone, with the buckets:
    the place checks above keep theirs, so that each alone refuses what its policy must never name)."""
    problems = [_pattern_problem(field, uri, "") for field, uri in dataset_places(spec) if iam_pattern(uri)]
    prefix = spec.checkpoint.s3_prefix
    if prefix and iam_pattern(prefix):
        problems.append(_pattern_problem("checkpoint.s3_prefix", prefix, " (other jobs' checkpoints)"))
    return problems


# The S3 places a job's nodes' IAM policy names one by one (dataset.uri, its replicas, checkpoint.s3_prefix):
# IAM takes at most 10,240 characters of inline policy per role; the rest of it (4 regions) is ~3,600
# and each place costs ~4x its length, so together they keep to this (else the first launch fails on IAM).
MAX_NAMED_PLACES_CHARS = 1200


def named_places_problems(spec: JobSpec) -> Problems:
    """The dataset and checkpoint places together too long for the nodes' per-job IAM policy."""
    places = dataset_uris(spec) + ([spec.checkpoint.s3_prefix] if spec.checkpoint.s3_prefix else [])
    total = sum(len(p) for p in places)
    if total <= MAX_NAMED_PLACES_CHARS:
        return []
    field = "dataset" if spec.dataset is not None else "checkpoint.s3_prefix"
    return [(field, f"dataset.uri, its replicas and checkpoint.s3_prefix hold {total} characters together; the "
                    f"nodes' IAM policy names each, and they may hold at most {MAX_NAMED_PLACES_CHARS}: use shorter "
                    "prefixes")]


def fsx_problems(spec: JobSpec, fsx_enabled: bool | None) -> Problems:
    """``dataset.fsx`` on a deployment without FSx for Lustre (``fsx_enabled`` off): no node could
    mount it. None: unknown (the twin), not checked."""
    if fsx_enabled is not False or spec.dataset is None or spec.dataset.fsx is None:
        return []
    return [("dataset.fsx", "this deployment has no FSx for Lustre file system (its fsx_enabled is off, "
                            "deploy.md); drop dataset.fsx and read the dataset from S3, or deploy with FSx")]


def deepspeed_problems(spec: JobSpec) -> Problems:
    config = spec.launcher.deepspeed_config
    where = "launcher.deepspeed_config"
    if isinstance(config, str):
        why = inside(config)
        if why is None and not config.lower().endswith(".json"):
            why = "must name a .json file"
        return [(where, why)] if why else []
    if config is None:
        return []
    size = len(json.dumps(config, separators=(",", ":")))
    if size > MAX_DEEPSPEED_CONFIG_BYTES:
        return [(where, f"is {size} bytes as JSON; the limit is {MAX_DEEPSPEED_CONFIG_BYTES}")]
    problems: Problems = [(f"{where}.{key}", why) for key, why in RESERVED_DEEPSPEED.items() if key in config]
    return problems + _batch_problems(config, spec)


def _batch_problems(config: dict[str, Any], spec: JobSpec) -> Problems:
    """DeepSpeed refuses to start unless batch = micro batch x accumulation x world size."""
    keys = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
    values = [config.get(k) for k in keys]
    problems: Problems = [(f"launcher.deepspeed_config.{k}", "must be a positive integer")
                          for k, v in zip(keys, values, strict=True)
                          if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1)]
    if problems or None in values or spec.resources.gpus_per_node == 0:
        return problems
    batch, micro, steps = (int(v) for v in values)  # type: ignore[arg-type]
    world = spec.resources.nodes * spec.resources.gpus_per_node
    if batch != micro * steps * world:
        problems.append(("launcher.deepspeed_config.train_batch_size",
                         f"is {batch}, but DeepSpeed needs micro batch x accumulation x ranks = "
                         f"{micro} x {steps} x {world} = {micro * steps * world}; give two of the three"))
    gpus = spec.resources.gpus_per_node
    for nodes in range(spec.resources.smallest_gang, spec.resources.nodes):  # elastic: every smaller gang
        if batch % (micro * nodes * gpus):
            problems.append(("resources.min_nodes",
                             f"a gang of {nodes} nodes cannot keep the global batch {batch} with micro batch "
                             f"{micro} ({nodes * gpus} ranks); raise min_nodes or pick a batch they all divide"))
            break
    return problems


def gpu_problems(spec: JobSpec) -> Problems:
    """More ranks per node than an instance type has GPUs: torchrun would start, CUDA would not."""
    want = spec.resources.gpus_per_node
    if want == 0:
        return []
    from spotrelay.placement.catalog import instance  # lazy: placement imports the spec

    small = [(t, info.gpus) for t in spec.resources.instance_types if (info := instance(t)) and info.gpus < want]
    return [("resources.gpus_per_node", f"is {want}, but {t} has {gpus} GPUs") for t, gpus in small]


def schedule_problems(spec: JobSpec) -> Problems:
    """A wall-time limit with no on-demand to keep it: it would never act (placement/spot_evidence.WallLimit)."""
    if spec.recovery.max_slowdown is not None and "on-demand" not in spec.resources.markets:
        return [("recovery.max_slowdown", "needs on-demand in resources.markets: it keeps the job on schedule by "
                                          "moving it there when spot falls behind")]
    return []


def launch_problems(spec: JobSpec) -> Problems:
    return (entrypoint_problems(spec) + code_problems(spec) + deepspeed_problems(spec) + gpu_problems(spec)
            + schedule_problems(spec) + pattern_problems(spec))
