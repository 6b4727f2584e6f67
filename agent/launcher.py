"""Build and run the training command: torchrun or the DeepSpeed per-node launcher.

Every rank runs through a thin wrapper (``python -m agent.launcher <script> <args>``) that records
the rank's own exit code in ``<control>/exit/rank-<N>.json``. The launchers do not pass it on:
torchrun exits 1 whenever a worker fails, so without the record a preempted-and-saved rank (75)
would look like a user error. The wrapper runs before every rank's script, so this module imports
only what it needs at the top: the agent's models (config, job, spec) are for the agent side.
"""

from __future__ import annotations

import base64
import json
import os
import runpy
import signal
import subprocess
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING

from agent.deferred_imports import ENV_DEFER, defer
from spotrelay.contracts import control
from spotrelay.contracts.exit_codes import ExitCode

if TYPE_CHECKING:  # the agent side's models: the per-rank wrapper never needs them (0.2-0.5 s per rank)
    from agent.config import AgentConfig
    from spotrelay.contracts.agent import JobView
    from spotrelay.spec.models import JobSpec

EXIT_DIR = "exit"
WRAPPER = "agent.launcher"
PYTHONS = {"python", "python3", sys.executable}


@dataclass(frozen=True)
class Rendezvous:
    nodes: int
    node_rank: int
    nproc_per_node: int
    master_addr: str
    master_port: int


@dataclass(frozen=True)
class LaunchPlan:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)  # added to the agent's environment
    cwd: str = "."


def efa_nccl_env(instance_type: str | None, gpus_per_node: int) -> dict[str, str]:
    """NCCL over EFA on P5 (32 EFA NICs, 3200 Gbps) and P4d (4 NICs, 400 Gbps); nothing elsewhere."""
    family = (instance_type or "").split(".")[0]
    if gpus_per_node == 0 or family not in ("p5", "p5e", "p5en", "p4d", "p4de"):
        return {}
    return {
        # libfabric's EFA provider (through aws-ofi-nccl) instead of NCCL's TCP sockets: the only
        # way to reach EFA bandwidth between nodes.
        "FI_PROVIDER": "efa",
        # GPUDirect RDMA: the NIC reads and writes GPU memory directly, no bounce through host RAM.
        "FI_EFA_USE_DEVICE_RDMA": "1",
        # data-loader workers fork; make libfabric's registered memory safe across fork().
        "FI_EFA_FORK_SAFE": "1",
        # bootstrap traffic on the primary ENI, never loopback or container bridges.
        "NCCL_SOCKET_IFNAME": "^lo,docker,veth",
        # a dead peer (reclaimed instance) aborts the communicator at once instead of hanging until
        # the collective timeout; the exit is quick and the agent can classify it.
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        # enough to explain a failing collective without flooding the logs.
        "NCCL_DEBUG": "WARN",
    }


def _entry(spec: JobSpec) -> tuple[bool, list[str]]:
    """(is_python, argv after the interpreter) of the entrypoint."""
    entry = spec.entrypoint
    if entry.script is not None:
        return True, [entry.script, *entry.args]
    command = list(entry.command or [])
    if Path(command[0]).name in PYTHONS or command[0] in PYTHONS:
        return True, command[1:]
    return False, command


def torchrun_argv(python: str, rdzv: Rendezvous, spec: JobSpec) -> list[str]:
    is_python, rest = _entry(spec)
    argv = [
        python,
        "-m",
        "torch.distributed.run",
        f"--nnodes={rdzv.nodes}",
        f"--node-rank={rdzv.node_rank}",
        f"--nproc-per-node={rdzv.nproc_per_node}",
        # static rendezvous on node rank 0: ranks are fixed by node rank, so a resumed attempt
        # gives every rank the same shard of the checkpoint
        f"--master-addr={rdzv.master_addr}",
        f"--master-port={rdzv.master_port}",
        # restarts are the controller's decision; a local restart would hide a preemption
        "--max-restarts=0",
    ]
    if is_python:
        return [*argv, "-m", WRAPPER, *rest]
    return [*argv, "--no-python", *rest]


def deepspeed_argv(python: str, rdzv: Rendezvous, spec: JobSpec) -> list[str]:
    # The per-node launcher the `deepspeed` runner itself starts on every host: it needs no ssh
    # and no hostfile, and it exits with the failing rank's code.
    hosts = {f"node-{i}": list(range(rdzv.nproc_per_node)) for i in range(rdzv.nodes)}
    world = base64.urlsafe_b64encode(json.dumps(hosts).encode()).decode()
    is_python, rest = _entry(spec)
    argv = [
        python,
        "-u",
        "-m",
        "deepspeed.launcher.launch",
        f"--world_info={world}",
        f"--node_rank={rdzv.node_rank}",
        f"--master_addr={rdzv.master_addr}",
        f"--master_port={rdzv.master_port}",
    ]
    if is_python:
        return [*argv, "--module", WRAPPER, *rest]
    return [*argv, "--no_python", *rest]


def checkpoint_uri(config: AgentConfig, spec: JobSpec) -> str:
    if config.checkpoint_uri:
        return config.checkpoint_uri
    if spec.checkpoint.s3_prefix:
        return spec.checkpoint.s3_prefix.rstrip("/")
    if config.durable_root:  # the deployment's, from the agent's port
        return f"{config.durable_root.rstrip('/')}/{config.job_id}"
    from spotrelay.errors import AgentConfigError

    raise AgentConfigError("no durable tier: set checkpoint_uri, the spec's checkpoint.s3_prefix or durable_root")


def _cadence_env(config: AgentConfig, job: JobView, spec: JobSpec) -> dict[str, str]:
    """The time-based cadence: the spec's minutes, or "auto" with its bounds and this attempt's loss
    interval from the controller (none: no loss expected, or a record from before auto)."""
    from spotrelay.contracts.cadence import AUTO

    ckpt = spec.checkpoint
    if not ckpt.auto:
        return {control.ENV_CHECKPOINT_EVERY_MINUTES: str(ckpt.fixed_minutes)}
    env = {
        control.ENV_CHECKPOINT_EVERY_MINUTES: AUTO,
        control.ENV_CHECKPOINT_AUTO_MIN_MINUTES: str(ckpt.auto_min_minutes),
        control.ENV_CHECKPOINT_AUTO_MAX_MINUTES: str(ckpt.auto_max_minutes),
    }
    # this attempt's; a survivor carried into a new attempt may read the job before the controller wrote
    # that attempt (its node record comes first): the newest attempt before it then (the same pool, usually)
    known = next((a for a in job.attempts if a.number == config.attempt), None) or max(
        (a for a in job.attempts if a.number < config.attempt), key=lambda a: a.number, default=None)
    if known is not None and known.loss_interval_s is not None:
        env[control.ENV_CHECKPOINT_LOSS_INTERVAL_S] = repr(known.loss_interval_s)
    return env


def deepspeed_config_path(config: AgentConfig, spec: JobSpec) -> str | None:
    """Where the ranks find the spec's ``launcher.deepspeed_config``: an inline one written as JSON into
    the control dir (each launch rewrites it: a resumed spec may carry another), a path as the spec gives
    it (relative to ``working_dir``, the ranks' cwd)."""
    given = spec.launcher.deepspeed_config
    if given is None or isinstance(given, str):
        return given
    path = config.control / control.DEEPSPEED_CONFIG_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(given, indent=1))
    tmp.replace(path)  # (a rank of a restarted launch never reads half a file)
    return str(path.resolve())


def contract_env(config: AgentConfig, job: JobView, spec: JobSpec, mlflow_run_id: str | None) -> dict[str, str]:
    """What the training API reads (spotrelay.contracts.control): control dir, tiers, cadence."""
    from spotrelay.contracts.health import ENV_HEALTH

    ckpt = spec.checkpoint
    env = {
        control.ENV_CONTROL_DIR: str(config.control),
        control.ENV_JOB_ID: config.job_id,
        control.ENV_ATTEMPT: str(config.attempt),
        control.ENV_CHECKPOINT_DIR: str(config.checkpoint_dir or Path(ckpt.local_dir) / config.job_id),
        control.ENV_CHECKPOINT_URI: checkpoint_uri(config, spec),
        control.ENV_SPEC_HASH: job.spec_hash,
        control.ENV_KEEP_LOCAL: str(ckpt.keep_local),
        control.ENV_KEEP_S3: str(ckpt.keep_s3),
    }
    if job.training_hash:  # the controller's hash of the submitted spec's training definition
        env[control.ENV_TRAINING_HASH] = job.training_hash
    if ckpt.every_steps is not None:
        env[control.ENV_CHECKPOINT_EVERY_STEPS] = str(ckpt.every_steps)
    if ckpt.every_minutes is not None:
        env.update(_cadence_env(config, job, spec))
    if mlflow_run_id:
        env[control.ENV_MLFLOW_RUN_ID] = mlflow_run_id
    if spec.tracking.tracking_uri:
        env["MLFLOW_TRACKING_URI"] = spec.tracking.tracking_uri
    ds_config = deepspeed_config_path(config, spec)
    if ds_config is not None:
        env[control.ENV_DEEPSPEED_CONFIG] = ds_config
    env[ENV_HEALTH] = spec.health.model_dump_json()
    return env


def build_plan(
    spec: JobSpec, rdzv: Rendezvous, contract_env: dict[str, str], instance_type: str | None, python: str
) -> LaunchPlan:
    build = deepspeed_argv if spec.launcher.type == "deepspeed" else torchrun_argv
    env = {
        **efa_nccl_env(instance_type, spec.resources.gpus_per_node),
        **spec.entrypoint.env,
        **contract_env,  # last: user env cannot redirect the control channel
        "PYTHONUNBUFFERED": "1",
    }
    return LaunchPlan(build(python, rdzv, spec), env, spec.entrypoint.working_dir)


# --- running ---------------------------------------------------------------------------------
class TrainingProcess:
    """The launcher process in its own session, so the agent can signal or kill the whole tree."""

    def __init__(self, plan: LaunchPlan, control_dir: Path, log: IO[bytes] | None = None) -> None:
        self.plan = plan
        self.control_dir = control_dir
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        exits = self.control_dir / EXIT_DIR
        exits.mkdir(parents=True, exist_ok=True)
        for old in exits.glob("rank-*.json"):  # records of a previous run are not ours
            old.unlink()
        self.proc = subprocess.Popen(
            self.plan.argv,
            env={**os.environ, **self.plan.env},
            cwd=self.plan.cwd,
            stdout=self.log,
            stderr=subprocess.STDOUT if self.log else None,
            start_new_session=True,
        )

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def poll(self) -> int | None:
        return self.proc.poll() if self.proc else None

    def relay(self, signum: int) -> None:
        """Pass a signal to the launcher, which forwards it to its ranks."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signum)

    def kill_tree(self, grace_s: float) -> int:
        """SIGTERM the whole session, then SIGKILL after ``grace_s``; the launcher's exit code."""
        assert self.proc is not None
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            if self.proc.poll() is not None:
                break
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(wait)
            except subprocess.TimeoutExpired:
                continue
        return self.proc.wait()

    def worker_codes(self) -> dict[int, int]:
        return read_exit_records(self.control_dir)


def read_exit_records(control_dir: Path) -> dict[int, int]:
    codes: dict[int, int] = {}
    for path in (control_dir / EXIT_DIR).glob("rank-*.json"):
        try:
            record = json.loads(path.read_text())
            codes[int(record["rank"])] = int(record["code"])
        except (OSError, ValueError, KeyError):
            continue
    return codes


# --- the per-rank wrapper --------------------------------------------------------------------
# A collective that fails because a peer went away (its instance was reclaimed or killed) is an
# infrastructure failure, not the user's bug: the surviving ranks see these.
PEER_LOST = (
    "Connection reset by peer",
    "Connection closed by peer",
    "Broken pipe",
    "ncclRemoteError",
    "NCCL communicator was aborted",
    "remote process exited",
    "Socket Timeout",
)
DIST_NETWORK_ERRORS = ("DistNetworkError", "DistStoreError")


def lost_peer(exc: BaseException) -> bool:
    names = {cls.__name__ for cls in type(exc).__mro__}
    return bool(names & set(DIST_NETWORK_ERRORS)) or any(marker in str(exc) for marker in PEER_LOST)


def _code_of(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    return exc.code if isinstance(exc.code, int) else 1


def worker_main(argv: list[str]) -> None:
    """Run ``script args`` as ``__main__`` and record its exit code; DeepSpeed passes --local_rank first."""
    local_rank = [a for a in argv[:1] if a.startswith("--local_rank")]
    script, *args = argv[len(local_rank) :]
    sys.argv = [script, *local_rank, *args]
    sys.path.insert(0, str(Path(script).resolve().parent))  # as `python script.py` does
    if os.environ.get(ENV_DEFER) != "0":
        defer()  # packages `import deepspeed` probes for and the script may never use (agent.deferred_imports)
    code, error = 1, ""
    try:
        runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = _code_of(exc)
        raise
    except BaseException as exc:
        error = traceback.format_exc()[-8192:]  # this rank's own cause (agent/output_tail.py quotes it)
        if not lost_peer(exc):
            raise
        traceback.print_exc()
        code = ExitCode.INFRA_ERROR
        raise SystemExit(code) from exc
    finally:
        control_dir = os.environ.get(control.ENV_CONTROL_DIR)
        if control_dir:
            rank = os.environ.get("RANK", "0")
            record = {"rank": int(rank), "code": int(code), **({"error": error} if error else {})}
            control.write_atomic(Path(control_dir) / EXIT_DIR / f"rank-{rank}.json", json.dumps(record))


if __name__ == "__main__":
    worker_main(sys.argv[1:])
