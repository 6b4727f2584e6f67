"""The failing rank's output goes with TrainingExited: recorded by the real per-rank wrapper in a
real process, bounded, and quoted into the attempt's reason by the classifier."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from agent.launcher import EXIT_DIR
from agent.output_tail import TAIL_LINES, bound, failure_tail
from spotrelay.contracts.events import MAX_OUTPUT_TAIL
from spotrelay.contracts.recovery import Verdict
from spotrelay.domain.models import Node, NodeState, Pool
from spotrelay.recovery.classify import classify_nodes

ROOT = Path(__file__).resolve().parents[2]


def _run_rank(tmp_path: Path, script: str, rank: int = 3) -> tuple[int, Path]:
    """``python -m agent.launcher script.py`` as torchrun starts each rank, output into the node log."""
    (tmp_path / "train.py").write_text(script)
    log = tmp_path / "train-a1.log"
    env = {**os.environ, "SPOTRELAY_CONTROL_DIR": str(tmp_path / "control"), "RANK": str(rank),
           "PYTHONPATH": str(ROOT)}
    with open(log, "ab") as out:
        code = subprocess.run([sys.executable, "-m", "agent.launcher", str(tmp_path / "train.py")], env=env,
                              stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path, timeout=120).returncode
    return code, log


def test_a_script_that_raises_sends_its_own_traceback(tmp_path: Path) -> None:
    code, log = _run_rank(tmp_path, "for i in range(500):\n    print('step', i)\n"
                                    "open('data/shard-0.bin')\n")
    assert code == 1
    tail = failure_tail(code, tmp_path / "control" / EXIT_DIR, log)
    assert "FileNotFoundError" in tail and "data/shard-0.bin" in tail and "step 499" not in tail
    assert len(tail) <= MAX_OUTPUT_TAIL


def test_a_script_that_exits_with_a_code_sends_the_end_of_the_log(tmp_path: Path) -> None:
    code, log = _run_rank(tmp_path, "import sys\nprint('bad config: lr must be > 0', flush=True)\nsys.exit(3)\n")
    assert code == 3
    assert failure_tail(code, tmp_path / "control" / EXIT_DIR, log).endswith("bad config: lr must be > 0")


def test_a_clean_or_preempted_exit_sends_nothing(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text("Traceback (most recent call last):\nboom\n")
    assert failure_tail(0, tmp_path, log) == "" and failure_tail(75, tmp_path, log) == ""


def test_the_tail_is_bounded_in_lines_and_characters() -> None:
    text = "\n".join(f"line {i} " + "x" * 300 for i in range(10_000))
    tail = bound(text)
    assert len(tail) <= MAX_OUTPUT_TAIL and tail.endswith("line 9999 " + "x" * 300)
    assert len(bound("\n".join(str(i) for i in range(1000))).splitlines()) == TAIL_LINES


def _node(rank: int, code: int, tail: str | None = None, state: NodeState = NodeState.EXITED) -> Node:
    pool = Pool(region="us-east-1", az="us-east-1a", instance_type="p5.48xlarge", market="spot")
    return Node(job_id="j", node_id=f"a1-r{rank}", attempt=1, rank=rank, instance_id=f"i-{rank}", pool=pool,
                state=state, exit_code=code, output_tail=tail)


def test_the_classifier_quotes_the_deciding_ranks_output() -> None:
    end = classify_nodes([_node(0, 77, "peer gone"), _node(1, 1, "ValueError: bad shape")])
    assert end.outcome is Verdict.USER_ERROR and end.reason.endswith("its output ended with:\nValueError: bad shape")
    interrupted = classify_nodes([_node(0, 75, "saved"), _node(1, 1, "x", state=NodeState.DOOMED)])
    assert interrupted.outcome is Verdict.INTERRUPTED and "output" not in interrupted.reason
