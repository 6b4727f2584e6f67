"""Steps lost: what a gang trained past the checkpoint the next one resumes from, counted once.

It was ``job.last_step`` (the furthest step ever reported) less the newest checkpoint, added at each
recovery without a notice: a second recovery with no training between (the next gang lost while it
booted) counted the same steps again, and a new gang lost while the last one still drained toward
its emergency save counted steps that save then kept. Now each attempt keeps the furthest step its
ranks reported (``Attempt.reached_step``) and its own loss (``lost_steps``, once)."""

from __future__ import annotations

import time
import uuid

from spotrelay.adapters.memory_job_store import MemoryJobStore
from spotrelay.contracts.events import CheckpointCommitted, Heartbeat, TrainingExited
from spotrelay.contracts.exit_codes import ExitCode
from spotrelay.contracts.recovery import AttemptEnd, Verdict
from spotrelay.contracts.workflow import WorkflowTimings
from spotrelay.domain.models import Attempt, Job, Node, NodeState
from spotrelay.domain.status import JobStatus
from spotrelay.placement import InMemoryPoolStatsStore
from spotrelay.ports.compute import LaunchRequest
from spotrelay.services.controller import Controller
from spotrelay.services.node_events import handle_agent_event
from spotrelay.services.recovery_flow import recover
from tests.integration.controller_doubles import QuotedMarket, ScriptedCompute, new_job, pool

JOB = "job-steps"


def _ids(node: Node) -> dict[str, object]:
    return {"event_id": f"evt-{uuid.uuid4().hex}", "job_id": JOB, "node_id": node.node_id,
            "instance_id": node.instance_id, "attempt": node.attempt, "rank": node.rank, "time": time.time()}


class Gangs:
    def __init__(self) -> None:
        self.store, self.compute, self.now = MemoryJobStore(), ScriptedCompute(), time.time()
        new_job(self.store, job_id=JOB, status=JobStatus.RUNNING, strategy="replace-cluster", max_recoveries=5,
                launch_at_notice=True)
        self.ctl = Controller(store=self.store, compute=self.compute, market=QuotedMarket(),
                              pool_stats=InMemoryPoolStatsStore())

    def start(self, attempt: int, state: NodeState = NodeState.RUNNING) -> list[Node]:
        """Attempt ``attempt``'s gang of two is up (the job on it, as provision leaves it)."""
        where = pool()
        nodes = []
        for inst in self.compute.launch(LaunchRequest(job_id=JOB, attempt=attempt, pool=where, count=2, ranks=[0, 1])):
            node = Node(job_id=JOB, node_id=f"a{attempt}-r{inst.rank}", attempt=attempt, rank=inst.rank,
                        instance_id=inst.instance_id, pool=where, launched_at=self.now, state=state)
            self.store.put_node(node)
            nodes.append(node)
        status = JobStatus.RUNNING if state is NodeState.RUNNING else JobStatus.STARTING
        self.store.update_job(JOB, lambda j: j.model_copy(update={
            "attempt": attempt, "status": status, "attempts": [*j.attempts, Attempt(
                number=attempt, pool=where, price_per_hour=30.0, nodes=2, started_at=self.now)]}))
        return nodes

    def trains(self, nodes: list[Node], to: int, saved: int) -> None:
        handle_agent_event(self.ctl, CheckpointCommitted(**_ids(nodes[0]), step=saved, uri="s3://b/c",  # type: ignore[arg-type]
                                                         duration_s=1.0), self.now)
        handle_agent_event(self.ctl, Heartbeat(**_ids(nodes[0]), step=to), self.now)  # type: ignore[arg-type]

    def lose(self, node: Node, attempt: int, deadline: float | None = None) -> None:
        if deadline is None:
            self.store.update_node(JOB, node.node_id, lambda n: n.model_copy(update={"state": NodeState.LOST}))
        else:
            self.store.update_node(JOB, node.node_id, lambda n: n.model_copy(update={
                "state": NodeState.DOOMED, "reclaim_at": deadline}))
        verdict = Verdict.NODE_LOST if deadline is None else Verdict.INTERRUPTED
        recover(self.ctl, JOB, AttemptEnd(outcome=verdict, attempt=attempt, reason="test", lost_ranks=(node.rank,),
                                          deadline=deadline), WorkflowTimings(), self.now)

    def job(self) -> Job:
        return self.store.get_job(JOB)


def test_a_loss_counts_the_steps_past_the_checkpoint_and_a_second_recovery_no_more() -> None:
    g = Gangs()
    first = g.start(1)
    g.trains(first, to=45, saved=40)
    g.lose(first[1], 1)
    assert g.job().steps_lost == 5 and g.job().attempts[0].lost_steps == 5
    second = g.start(2, NodeState.PENDING)  # the next gang is lost while it boots: it trained nothing
    g.lose(second[0], 2)
    assert g.job().steps_lost == 5 and g.job().attempts[1].lost_steps == 0  # (was 10: 45 - 40 again)
    third = g.start(3)
    g.trains(third, to=44, saved=40)  # it redid 41-44 and lost them again: those count again
    g.lose(third[0], 3)
    assert g.job().steps_lost == 9 and [a.lost_steps for a in g.job().attempts] == [5, 0, 4]


def test_a_new_gang_lost_while_the_last_one_drains_counts_nothing_its_missed_save_counts_once() -> None:
    g = Gangs()
    first = g.start(1)
    g.trains(first, to=45, saved=40)
    g.lose(first[1], 1, deadline=g.now + 120)  # launch at notice: both ranks drain toward their save
    assert g.job().steps_lost == 0
    second = g.start(2, NodeState.PENDING)
    g.lose(second[0], 2)  # the new gang's node goes while the old ranks still save
    assert g.job().steps_lost == 0  # (was 5: the save to come keeps them)
    for node in first:  # ... which misses its deadline: the drained ranks exit unsaved at step 47
        drained = g.store.get_node(JOB, node.node_id)
        assert drained.release_after is not None
        handle_agent_event(g.ctl, TrainingExited(**_ids(node), exit_code=int(ExitCode.PREEMPTED_UNSAVED),  # type: ignore[arg-type]
                                                 reason="unsaved", last_step=47), g.now)
    assert g.job().steps_lost == 7 and g.job().attempts[0].lost_steps == 7  # once, for both ranks


def test_describe_shows_each_attempts_reach_and_loss() -> None:
    from rich.console import Console

    from spotrelay.cli.views import show_attempts
    from spotrelay.services.describe import describe_job

    g = Gangs()
    first = g.start(1)
    g.trains(first, to=45, saved=40)
    g.lose(first[1], 1)
    g.start(2)
    job = g.job()
    report = describe_job(job, g.store.nodes_of(JOB), g.now)
    assert [(a.reached_step, a.lost_steps) for a in report.attempts] == [(45, 5), (None, None)]
    console = Console(width=200, record=True)
    show_attempts(console, job)
    lines = console.export_text().splitlines()
    header = [c.strip() for c in next(line for line in lines if "┃" in line).split("┃")]
    rows = [[c.strip() for c in line.split("│")] for line in lines if "│" in line]
    first_row = dict(zip(header, rows[0], strict=True))
    assert first_row["reached"] == "45" and first_row["lost"] == "5"
