"""The real launchers (torchrun, DeepSpeed's per-node launcher) with the per-rank exit record.

torchrun reports only "a worker failed" (exit 1); the records keep each rank's own code, so the
agent can tell preempted-and-saved (75) from a user error.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent.actions import classify_exit
from agent.launcher import Rendezvous, build_plan, read_exit_records
from spotrelay.contracts import control
from spotrelay.contracts.control import RequestKind, StopRequest
from spotrelay.contracts.exit_codes import ExitCode
from spotrelay.local.motoserver import free_port
from spotrelay.spec.models import JobSpec

pytestmark = pytest.mark.slow

SCRIPT = """
import os, sys
assert os.environ["WORLD_SIZE"] == "2" and os.environ["MASTER_PORT"]
sys.exit(int(sys.argv[sys.argv.index("--code") + 1]) if os.environ["RANK"] == "1" else 75)
"""


@pytest.mark.parametrize(("launcher", "launcher_code"), [("torchrun", 1), ("deepspeed", 75)])
def test_rank_codes_survive_the_launcher(tmp_path: Path, launcher: str, launcher_code: int) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    spec = JobSpec.model_validate(
        {
            "version": 1,
            "name": "t",
            "entrypoint": {"script": str(script), "args": ["--code", "75"]},
            "launcher": {"type": launcher, **({"deepspeed_config": {}} if launcher == "deepspeed" else {})},
            "resources": {"nodes": 1, "gpus_per_node": 0},
            "checkpoint": {"every_steps": 1},
        }
    )
    ctl = tmp_path / "ctl"
    plan = build_plan(
        spec, Rendezvous(1, 0, 2, "127.0.0.1", free_port()), {control.ENV_CONTROL_DIR: str(ctl)}, None, sys.executable
    )
    result = subprocess.run(plan.argv, env={**os.environ, **plan.env}, capture_output=True, timeout=120)
    assert result.returncode == launcher_code, result.stderr.decode()[-2000:]
    # a launcher stops the other ranks at the first exit, so a slower rank may never record its code
    records = read_exit_records(ctl)
    assert records and set(records.values()) == {75}
    stop = StopRequest(request_id="r", kind=RequestKind.CHECKPOINT_AND_STOP, deadline=1.0)
    assert classify_exit(result.returncode, read_exit_records(ctl), stop, True, False)[0] == ExitCode.PREEMPTED_SAVED
