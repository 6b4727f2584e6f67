"""Recovery after a notice-like end (a doomed node still saving, a deadline) while that node's exit
is being recorded: the dropped node must leave, not stay in the gang.

Found by the e2e health test under load (docs/chaos.md): the straggler of rank 1 was doomed, both
ranks exited 75, and recover ran while rank 1's TrainingExited was written. recover read rank 1 as
DOOMED (still saving) and went to mark it draining; by then it was EXITED, the mark was skipped and
the node was neither draining nor released. The plan then kept it (an EXITED instance still runs),
restarted attempt 2 on the straggler, and the job went on to spend its recoveries on a survivor
whose agent had already left."""

from __future__ import annotations

import time
from typing import Any

from spotrelay.adapters.memory_job_store import MemoryJobStore
from spotrelay.contracts.recovery import AttemptEnd, RecoveryAction, Verdict
from spotrelay.contracts.workflow import WorkflowTimings
from spotrelay.domain.models import Attempt, Node, NodeState
from spotrelay.domain.status import JobStatus
from spotrelay.placement import InMemoryPoolStatsStore
from spotrelay.ports.compute import LaunchRequest
from spotrelay.services.controller import Controller
from spotrelay.services.recovery_flow import recover
from tests.integration.controller_doubles import QuotedMarket, ScriptedCompute, new_job, pool

JOB = "job-drain"


class ExitsDuringTheDrain(MemoryJobStore):
    """The exit of ``node_id`` lands between recover's read of the gang and its drain write."""

    def __init__(self, node_id: str) -> None:
        super().__init__()
        self.node_id, self.fired = node_id, False

    def update_node(self, job_id: str, node_id: str, change: Any, attempts: int = 3) -> Node | None:
        if node_id == self.node_id and not self.fired:
            self.fired = True
            super().update_node(job_id, node_id, lambda n: n.model_copy(update={
                "state": NodeState.EXITED, "exit_code": 75}))  # fmt: skip
        return super().update_node(job_id, node_id, change, attempts)


def test_a_doomed_node_that_exits_while_recover_drains_it_is_released_not_kept() -> None:
    store, compute, now = ExitsDuringTheDrain("a1-r1"), ScriptedCompute(), time.time()
    new_job(store, job_id=JOB, status=JobStatus.RUNNING, strategy="replace-lost-nodes")
    where = pool()
    gang = compute.launch(LaunchRequest(job_id=JOB, attempt=1, pool=where, count=2, ranks=[0, 1]))
    for inst in gang:
        doomed = inst.rank == 1  # the straggler: replace-node doomed it, no deadline for the ranks
        store.put_node(Node(job_id=JOB, node_id=f"a1-r{inst.rank}", attempt=1, rank=inst.rank,
                            instance_id=inst.instance_id, pool=where, launched_at=now,
                            state=NodeState.DOOMED if doomed else NodeState.EXITED,
                            exit_code=None if doomed else 75, reclaim_at=now + 300 if doomed else None))  # fmt: skip
    store.update_job(
        JOB,
        lambda j: j.model_copy(
            update={
                "attempt": 1,
                "attempts": [Attempt(number=1, pool=where, price_per_hour=30.0, nodes=2, started_at=now)],
            }
        ),
    )
    ctl = Controller(store=store, compute=compute, market=QuotedMarket(), pool_stats=InMemoryPoolStatsStore())
    end = AttemptEnd(
        outcome=Verdict.INTERRUPTED,
        attempt=1,
        reason="spot interruption of ranks [1]",
        lost_ranks=(1,),
        deadline=now + 300,
    )

    plan = recover(ctl, JOB, end, WorkflowTimings(), now)

    assert store.fired  # the exit did land in the middle
    straggler = next(i.instance_id for i in gang if i.rank == 1)
    assert plan.action is RecoveryAction.REPLACE_LOST and plan.launch_ranks == [1], plan
    assert straggler not in plan.keep_instance_ids
    assert straggler in compute.terminated and store.get_node(JOB, "a1-r1").state is NodeState.TERMINATED
