"""Launch commands (torchrun, DeepSpeed), the EFA/NCCL environment, and the per-rank exit record."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from agent.config import AgentConfig
from agent.launcher import LaunchPlan, Rendezvous, TrainingProcess, build_plan, contract_env, read_exit_records
from spotrelay.contracts import control
from spotrelay.contracts.agent import AttemptView, JobView
from spotrelay.errors import AgentConfigError
from spotrelay.spec.models import JobSpec

ROOT = Path(__file__).resolve().parents[2]
RDZV = Rendezvous(nodes=2, node_rank=1, nproc_per_node=8, master_addr="10.0.0.5", master_port=29500)
HANG_S = 120.0  # only catches a hang: every wait here is for a condition


def _spec(**over: Any) -> JobSpec:
    data: dict[str, Any] = {
        "version": 1,
        "name": "t",
        "entrypoint": {"script": "train.py", "args": ["--steps", "5"], "env": {"A": "1"}},
        "resources": {"nodes": 2},
        "checkpoint": {"every_steps": 10},
    }
    data.update(over)
    return JobSpec.model_validate(data)


def test_torchrun_command() -> None:
    plan = build_plan(_spec(), RDZV, {"X": "y"}, "p5.48xlarge", "/py")
    assert plan.argv == [
        "/py",
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--node-rank=1",
        "--nproc-per-node=8",
        "--master-addr=10.0.0.5",
        "--master-port=29500",
        "--max-restarts=0",
        "-m",
        "agent.launcher",
        "train.py",
        "--steps",
        "5",
    ]
    assert plan.env["FI_PROVIDER"] == "efa" and plan.env["FI_EFA_USE_DEVICE_RDMA"] == "1"
    assert plan.env["A"] == "1" and plan.env["X"] == "y"


def test_non_python_command_runs_without_wrapper() -> None:
    spec = _spec(entrypoint={"command": ["/bin/train-binary", "--fast"]})
    assert build_plan(spec, RDZV, {}, None, "/py").argv[-3:] == ["--no-python", "/bin/train-binary", "--fast"]
    spec = _spec(entrypoint={"command": ["python", "train.py", "--x"]})
    assert build_plan(spec, RDZV, {}, None, "/py").argv[-4:] == ["-m", "agent.launcher", "train.py", "--x"]


def test_deepspeed_command() -> None:
    spec = _spec(launcher={"type": "deepspeed", "deepspeed_config": {"train_batch_size": 8}})
    argv = build_plan(spec, RDZV, {}, "p4d.24xlarge", "/py").argv
    assert argv[:4] == ["/py", "-u", "-m", "deepspeed.launcher.launch"]
    world = json.loads(base64.urlsafe_b64decode(argv[4].split("=", 1)[1]))
    assert world == {"node-0": list(range(8)), "node-1": list(range(8))}
    assert "--node_rank=1" in argv and "--master_addr=10.0.0.5" in argv
    assert argv[-5:] == ["--module", "agent.launcher", "train.py", "--steps", "5"]


def test_efa_only_on_gpu_p5_p4d() -> None:
    assert "FI_PROVIDER" not in build_plan(_spec(), RDZV, {}, "g5.xlarge", "/py").env
    cpu = _spec(resources={"nodes": 2, "gpus_per_node": 0})
    assert "FI_PROVIDER" not in build_plan(cpu, RDZV, {}, "p5.48xlarge", "/py").env


def test_contract_environment(tmp_path: Path) -> None:
    config = AgentConfig(job_id="j-1", attempt=3, rank=0, nodes=2, work_dir=tmp_path, checkpoint_uri="s3://b/c/j-1")
    job = JobView(job_id="j-1", status="RUNNING", spec_hash="abc")
    env = contract_env(config, job, _spec(), "run-9")
    assert env[control.ENV_CONTROL_DIR] == str(tmp_path / "control")
    assert env[control.ENV_ATTEMPT] == "3" and env[control.ENV_SPEC_HASH] == "abc"
    assert control.ENV_TRAINING_HASH not in env  # a job record from before the training hash
    hashed = contract_env(config, job.model_copy(update={"training_hash": "t9"}), _spec(), None)
    assert hashed[control.ENV_TRAINING_HASH] == "t9"  # what a resume is checked against
    assert env[control.ENV_CHECKPOINT_URI] == "s3://b/c/j-1" and env[control.ENV_CHECKPOINT_EVERY_STEPS] == "10"
    assert env[control.ENV_MLFLOW_RUN_ID] == "run-9"
    # user env cannot redirect the control channel
    spec = _spec(entrypoint={"script": "t.py", "env": {control.ENV_CONTROL_DIR: "/elsewhere"}})
    plan = build_plan(spec, RDZV, env, None, "/py")
    assert plan.env[control.ENV_CONTROL_DIR] == str(tmp_path / "control")



def test_every_spotrelay_variable_the_agent_sets_is_refused_in_a_specs_env(tmp_path: Path) -> None:
    """contract_env overrides entrypoint.env silently; the spec's check names each such variable instead
    (job-spec.md). SPOTRELAY_HEALTH was set here but allowed there."""
    from spotrelay.spec.checks import agent_env

    config = AgentConfig(job_id="j-1", attempt=3, rank=0, work_dir=tmp_path, checkpoint_uri="s3://b/c/j-1")
    job = JobView(job_id="j-1", spec_hash="abc", training_hash="t9", attempts=[AttemptView(number=3,
                                                                                          loss_interval_s=900.0)])
    spec = _spec(checkpoint={"every_steps": 10, "every_minutes": "auto"},
                 launcher={"type": "deepspeed", "deepspeed_config": {"train_batch_size": 16}})
    set_here = {k for k in contract_env(config, job, spec, "run-9") if k.startswith("SPOTRELAY_")}
    assert set_here - agent_env() == set()

def test_an_auto_cadence_carries_this_attempts_loss_interval_and_the_bounds(tmp_path: Path) -> None:
    config = AgentConfig(job_id="j-1", attempt=3, rank=0, work_dir=tmp_path, checkpoint_uri="s3://b/c/j-1")
    attempts = [AttemptView(number=2, loss_interval_s=900.0), AttemptView(number=3, loss_interval_s=14400.25)]
    spec = _spec(checkpoint={"every_steps": 10, "every_minutes": "auto", "auto_max_minutes": 30})
    env = contract_env(config, JobView(job_id="j-1", attempts=attempts), spec, None)
    assert env[control.ENV_CHECKPOINT_EVERY_MINUTES] == "auto" and env[control.ENV_CHECKPOINT_EVERY_STEPS] == "10"
    assert float(env[control.ENV_CHECKPOINT_LOSS_INTERVAL_S]) == 14400.25  # attempt 3's, not attempt 2's
    bounds = (env[control.ENV_CHECKPOINT_AUTO_MIN_MINUTES], env[control.ENV_CHECKPOINT_AUTO_MAX_MINUTES])
    assert bounds == ("2.0", "30.0")
    # no loss expected on attempt 3, or no attempt at all yet: unset, the trainer saves at the ceiling
    for attempts in ([AttemptView(number=3)], [AttemptView(number=2, loss_interval_s=900.0), AttemptView(number=3)],
                     []):
        env = contract_env(config, JobView(job_id="j-1", attempts=attempts), spec, None)
        assert control.ENV_CHECKPOINT_LOSS_INTERVAL_S not in env and env[control.ENV_CHECKPOINT_EVERY_MINUTES] == "auto"
    # a survivor carried into attempt 3 before its record was written: the newest earlier attempt's
    early = [AttemptView(number=1, loss_interval_s=60.0), AttemptView(number=2, loss_interval_s=900.0)]
    env = contract_env(config, JobView(job_id="j-1", attempts=early), spec, None)
    assert float(env[control.ENV_CHECKPOINT_LOSS_INTERVAL_S]) == 900.0
    fixed = contract_env(config, JobView(job_id="j-1"), _spec(checkpoint={"every_minutes": 20}), None)
    assert fixed[control.ENV_CHECKPOINT_EVERY_MINUTES] == "20.0"
    assert not {control.ENV_CHECKPOINT_LOSS_INTERVAL_S, control.ENV_CHECKPOINT_AUTO_MIN_MINUTES} & fixed.keys()


def test_durable_tier_default_comes_from_the_port_not_the_controllers_settings(tmp_path: Path) -> None:
    job = JobView(job_id="j-1")
    bare = AgentConfig(job_id="j-1", attempt=1, rank=0, work_dir=tmp_path)
    with pytest.raises(AgentConfigError, match="durable tier"):
        contract_env(bare, job, _spec(), None)
    rooted = bare.model_copy(update={"durable_root": "s3://bkt/checkpoints/"})
    assert contract_env(rooted, job, _spec(), None)[control.ENV_CHECKPOINT_URI] == "s3://bkt/checkpoints/j-1"
    prefixed = _spec(checkpoint={"every_steps": 10, "s3_prefix": "s3://mine/ckpt/"})
    assert contract_env(rooted, job, prefixed, None)[control.ENV_CHECKPOINT_URI] == "s3://mine/ckpt"


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ("import sys; sys.exit(75)", 75),
        ("raise ValueError('x')", 1),
        ("raise RuntimeError('tensor sizes differ')", 1),
        ("", 0),
        # what gloo raises on the surviving rank when a peer's instance vanishes: not the user's bug
        (
            "raise RuntimeError('[gloo/transport/tcp/pair.cc:537] Read error [10.0.0.2]:1: Connection reset by peer')",
            77,
        ),
    ],
)
def test_wrapper_records_rank_exit_code(tmp_path: Path, body: str, code: int) -> None:
    script = tmp_path / "script.py"
    script.write_text(body)
    env = {**os.environ, control.ENV_CONTROL_DIR: str(tmp_path / "ctl"), "RANK": "3", "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-m", "agent.launcher", str(script)], env=env, capture_output=True)
    assert result.returncode == code
    assert read_exit_records(tmp_path / "ctl") == {3: code}


def test_wrapper_passes_argv_and_deepspeed_local_rank(tmp_path: Path) -> None:
    script = tmp_path / "script.py"
    script.write_text("import sys, json; print(json.dumps(sys.argv[1:]))")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-m", "agent.launcher", "--local_rank=2", str(script), "--a", "b"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert json.loads(out) == ["--local_rank=2", "--a", "b"]


def test_process_kill_tree_and_stale_records(tmp_path: Path) -> None:
    ctl = tmp_path / "ctl"
    control.write_atomic(ctl / "exit" / "rank-0.json", json.dumps({"rank": 0, "code": 75}))
    # a launcher whose child sleeps: both die with the session
    child = "import os,sys,time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(60)"
    launcher = f"import subprocess,sys,time; subprocess.Popen([sys.executable,'-c',{child!r},sys.argv[1]])"
    launcher += "; time.sleep(60)"
    pid_file = tmp_path / "child.pid"
    proc = TrainingProcess(LaunchPlan([sys.executable, "-c", launcher, str(pid_file)]), ctl)
    proc.start()
    assert proc.worker_codes() == {}  # the previous run's records are gone
    give_up = time.time() + HANG_S  # two interpreters start first: slow on a loaded machine, not a failure
    while not (pid_file.exists() and pid_file.read_text()):
        assert time.time() < give_up, "the launcher's child never started (a hang)"
        time.sleep(0.05)
    assert proc.kill_tree(grace_s=2) == -15
    child_pid = int(pid_file.read_text())
    give_up = time.time() + HANG_S
    while True:
        try:
            os.kill(child_pid, 0)
        except ProcessLookupError:
            break
        if time.time() > give_up:
            pytest.fail("the launcher's child survived")
        time.sleep(0.05)


def test_the_rank_wrapper_imports_none_of_the_agents_models() -> None:
    """`python -m agent.launcher` runs before every rank's script: the agent side's models (its
    config, the job spec with its YAML loader) stay out of it (CPU on every restart's path)."""
    probe = "import sys, agent.launcher; print(sorted(m for m in AGENT_SIDE if m in sys.modules))"
    agent_side = ["agent.config", "spotrelay.spec.models", "spotrelay.contracts.agent", "yaml"]
    out = subprocess.run(
        [sys.executable, "-c", f"AGENT_SIDE = {agent_side!r}\n{probe}"],
        env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert out.strip() == "[]"


def test_the_specs_deepspeed_config_reaches_the_ranks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """launcher.deepspeed_config was validated (its batch sizes against the global batch) and then given
    to no rank: a script had to carry its own copy. Inline, it is written to the control dir; a path is
    named as the spec gives it (relative to working_dir, the ranks' cwd)."""
    from spotrelay.training import deepspeed_config

    config = AgentConfig(job_id="j-1", attempt=1, rank=0, work_dir=tmp_path, checkpoint_uri="s3://b/c/j-1")
    inline = {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 3}, "bf16": {"enabled": True}}
    spec = _spec(launcher={"type": "deepspeed", "deepspeed_config": inline})
    env = contract_env(config, JobView(job_id="j-1"), spec, None)
    path = Path(env[control.ENV_DEEPSPEED_CONFIG])
    assert path.is_absolute() and path.parent == config.control.resolve()
    monkeypatch.setenv(control.ENV_DEEPSPEED_CONFIG, str(path))
    assert deepspeed_config() == inline  # what the rank gives deepspeed.initialize(config=...)
    named = contract_env(config, JobView(job_id="j-1"), _spec(launcher={"type": "deepspeed",
                                                                        "deepspeed_config": "ds/zero3.json"}), None)
    assert named[control.ENV_DEEPSPEED_CONFIG] == "ds/zero3.json"
    assert control.ENV_DEEPSPEED_CONFIG not in contract_env(config, JobView(job_id="j-1"), _spec(), None)
    monkeypatch.delenv(control.ENV_DEEPSPEED_CONFIG)
    with pytest.raises(RuntimeError, match=r"no launcher\.deepspeed_config"):
        deepspeed_config()
