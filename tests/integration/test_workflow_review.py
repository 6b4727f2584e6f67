"""The placement review through moto's execution of the job-run ASL: the outcome wait times out at
``$.launch.review_s`` (a poll every review_minutes), Review asks placement when its backoff is due or
the prices moved, Migrate launches the better gang first and only then tells the old ranks to save and
drain (make-before-break); no capacity there: the attempt goes on."""

from __future__ import annotations

import json

from functions import on_agent_event
from spotrelay.contracts.workflow import WorkflowTimings
from spotrelay.domain.models import NodeState
from spotrelay.domain.status import JobStatus
from tests.integration.controller_doubles import CAPACITY, agent_event, ctx, new_job, pool, wait_until
from tests.integration.test_workflow_job_run import Harness, wf

__all__ = ["wf"]

# spot costs more than on-demand at first: the job starts on on-demand
DEAR_SPOT = {pool("p5.48xlarge", "spot").key: 150.0, pool("p4d.24xlarge", "spot").key: 60.0,
             pool("p5.48xlarge", "on-demand").key: 98.0, pool("p4d.24xlarge", "on-demand").key: 32.0}
CHEAP_SPOT = {pool("p5.48xlarge", "spot").key: 20.0, pool("p4d.24xlarge", "spot").key: 8.0}
TIMINGS = WorkflowTimings(ready_timeout_s=120, heartbeat_s=120, outcome_timeout_s=600, backoff_s=0, backoff_max_s=1,
                          provision_retry_s=0, loss_settle_s=1)
REVIEW = {"review_minutes": 0.05, "launch_at_notice": True}  # a review every 3 s


def test_a_gang_on_on_demand_moves_to_spot_make_before_break(wf: Harness) -> None:
    wf.market.prices = dict(DEAR_SPOT)
    wf.compute.boot_s = {"p5.48xlarge": 1234.0, "p4d.24xlarge": 777.0}  # what the adapter expects per type
    job = new_job(wf.store, **REVIEW)
    arn = wf.start(job, TIMINGS)
    first = wf.agents_ready(1)
    assert wf.job().attempts[0].pool.market == "on-demand"
    assert wf.job().attempts[0].world_size == 2
    wf.market.prices.update(CHEAP_SPOT)  # spot got cheap: the next review moves the gang

    second = wf.gang(2)  # launched while the old gang still trains
    moved = wf.job()
    assert moved.attempts[1].pool.market == "spot" and moved.attempts[1].world_size == 2
    assert moved.attempts[0].end_reason == "migrate" and moved.recoveries == 0 and moved.excluded_pools == []
    # the move's target carries placement's loss interval into the new attempt (every_minutes: auto's input):
    # spot loses a gang far more often than on-demand's hardware does
    assert 0 < moved.attempts[1].loss_interval_s < moved.attempts[0].loss_interval_s
    old = [wf.store.get_node(job.job_id, n.node_id) for n in first]
    assert all(n.state is NodeState.DOOMED and n.release_after is not None for n in old)
    assert all(n.directive and n.directive["kind"] == "CHECKPOINT_NOW" and n.directive["deadline"] for n in old)
    assert {n.instance_id for n in first} <= set(wf.compute.running(job.job_id))  # not released before the save
    launch = wf.compute.launched[-1]
    assert launch.gang == 2 and launch.ranks == [0, 1]
    # the old ranks save by the new gang's expected NodeReady: the target instance type's boot
    boot = wf.compute.boot_s[launch.pool.instance_type]
    assert all(n.directive and n.directive["deadline"] - n.directive["issued_at"] == boot for n in old)
    assert all(n.reclaim_at == n.directive["deadline"] for n in old if n.directive)

    # the old ranks commit the final save and exit: their exit releases them
    on_agent_event.handler(agent_event("CheckpointCommitted", first[0], step=30, uri="s3://b/ckpt/step-30/",
                                       emergency=True), ctx())
    wf.exit_all(first, 75, last_step=30, last_committed_step=30)
    wait_until(lambda: not {n.instance_id for n in first} & set(wf.compute.running(job.job_id)),
               what="drained ranks released")
    for node in second:
        on_agent_event.handler(agent_event("NodeReady", node), ctx())
    wait_until(lambda: wf.job().status is JobStatus.RUNNING, what="the moved gang runs")
    wf.market.prices = {k: v for k, v in wf.market.prices.items() if "spot" in k}  # nothing better: stay
    wf.exit_all(second, 0)
    assert wf.finished(arn)["status"] == "SUCCEEDED"
    states = wf.states_entered(arn)
    assert "Migrate" in states and "Recover" not in states and wf.job().last_checkpoint.step == 30


def test_no_capacity_for_the_move_keeps_the_gang_training(wf: Harness) -> None:
    wf.market.prices = dict(DEAR_SPOT)
    wf.compute._fail = lambda p, n: CAPACITY if p.market == "spot" else None
    job = new_job(wf.store, **REVIEW)
    arn = wf.start(job, TIMINGS)
    first = wf.agents_ready(1)
    wf.market.prices.update(CHEAP_SPOT)
    # every spot pool refuses the move, one review after another; each then cools down
    wait_until(lambda: {k for k in CHEAP_SPOT} <= set(wf.compute.tried), what="both spot pools tried")
    wait_until(lambda: all(wf.stats.get_many([k])[k].cooldown_until > 0 for k in CHEAP_SPOT), what="cooldowns")
    current = wf.job()
    assert current.attempt == 1 and current.status is JobStatus.RUNNING and current.recoveries == 0
    assert all(wf.store.get_node(job.job_id, n.node_id).state is NodeState.READY for n in first)
    assert all(not (wf.store.get_node(job.job_id, n.node_id).directive or {}) for n in first)
    on_agent_event.handler(agent_event("Heartbeat", first[0], step=5), ctx())
    wf.exit_all(first, 0)
    assert wf.finished(arn)["status"] == "SUCCEEDED"
    states = wf.states_entered(arn)
    assert states.count("WaitOutcome") >= 2 and "Migrate" in states and "Recover" not in states


def _stays(arn: str) -> list[dict[str, object]]:
    """``$.launch`` after each Review that stayed (as NextReviewBackoff left it), oldest first."""
    from spotrelay.adapters.aws import client

    events = client("stepfunctions").get_execution_history(executionArn=arn, maxResults=1000)["events"]
    return [json.loads(e["stateExitedEventDetails"]["output"])["launch"] for e in events
            if e.get("stateExitedEventDetails", {}).get("name") == "NextReviewBackoff"]


def _fulls(stays: list[dict[str, object]]) -> list[dict[str, object]]:
    """The stays of full reviews: those that wrote a new backoff (a poll keeps the last one)."""
    return [s for i, s in enumerate(stays) if i == 0 or s["review_backoff"] != stays[i - 1]["review_backoff"]]


def test_reviews_that_stay_back_off_in_the_workflow(wf: Harness) -> None:
    """moto's execution of the ASL: the outcome wait times out every review_minutes (1 s here: a poll);
    each full review that stays doubles the interval to the next one (NextReviewBackoff): 2 s, then 4, 8
    (the cap, 16x, is unit-tested), and the polls between read the prices without placement scores."""
    wf.market.prices = dict(DEAR_SPOT)  # on-demand is cheapest: every review stays
    job = new_job(wf.store, review_minutes=0.02, launch_at_notice=True)  # review_s = int(1.2) = 1
    arn = wf.start(job, TIMINGS)
    first = wf.agents_ready(1)
    assert wf.job().attempts[0].pool.market == "on-demand"
    reads_before = len(wf.market.reads)

    def seen() -> tuple[list[dict[str, object]], list[dict[str, object]]]:
        stays = _stays(arn)
        return stays, _fulls(stays)

    def polled() -> bool:  # (one read of the history per check)
        stays, fulls = seen()
        return len(fulls) >= 3 and len(stays) > len(fulls)

    # three full reviews, and a poll between them (however slow moto's steps are, the backoff outgrows them)
    wait_until(polled, what="full reviews and a poll")
    stays, fulls = seen()
    assert [f["review_backoff"]["gap_s"] for f in fulls[:3]] == [2, 4, 8]  # type: ignore[index]
    assert all(s["review_s"] == 1 for s in stays)  # the polls: every review_minutes
    polls = len(stays) - len(fulls)
    reads = wf.market.reads[reads_before:]
    assert reads.count(False) >= polls and reads.count(True) <= len(fulls) + 1  # no placement scores for a poll
    wf.exit_all(first, 0)
    assert wf.finished(arn)["status"] == "SUCCEEDED"
    assert "Migrate" not in wf.states_entered(arn)


def test_a_price_move_brings_a_full_review_that_keeps_its_interval(wf: Harness) -> None:
    """The mark of the prices each full Review read travels in ``$.launch.review_mark`` (NextReviewMark);
    a poll that finds them changed reviews in full and keeps the interval instead of doubling it (that it
    comes before the backoff is due is shown on the simulated clock: test_review_cadence.py)."""
    wf.market.prices = dict(DEAR_SPOT)  # every review stays, before and after the change
    job = new_job(wf.store, review_minutes=0.02, launch_at_notice=True)  # review_s = int(1.2) = 1
    arn = wf.start(job, TIMINGS)
    first = wf.agents_ready(1)

    wait_until(lambda: len(_fulls(_stays(arn))) >= 3, what="three full reviews that stayed")
    before = _fulls(_stays(arn))
    assert before[0]["review_mark"] == before[2]["review_mark"]  # same prices: the same mark
    assert len(str(before[0]["review_mark"])) == 16
    wf.market.prices = {**DEAR_SPOT, pool("p5.48xlarge", "spot").key: 155.0}  # +3%, still dearer than on-demand
    wait_until(lambda: any(f["review_mark"] != before[0]["review_mark"] for f in _fulls(_stays(arn))),
               what="a full review that read the new prices")
    fulls = _fulls(_stays(arn))
    moved = next(i for i, f in enumerate(fulls) if f["review_mark"] != before[0]["review_mark"])
    last, new = fulls[moved - 1]["review_backoff"], fulls[moved]["review_backoff"]
    assert new["gap_s"] == last["gap_s"] < 16  # type: ignore[index]  # held, not doubled (16 s: the cap)
    wf.exit_all(first, 0)
    assert wf.finished(arn)["status"] == "SUCCEEDED"
    assert "Migrate" not in wf.states_entered(arn)


def test_a_pending_stop_is_not_moved(wf: Harness) -> None:
    """The budget's stop waits for the ranks' save (services/stop.py): a review meanwhile stays, even
    where a move would pay, and the job then ends FAILED on the budget without a second gang."""
    from functions import reconcile
    from tests.integration.controller_doubles import load_event

    wf.market.prices = dict(DEAR_SPOT)
    job = new_job(wf.store, **REVIEW)
    arn = wf.start(job, TIMINGS)
    first = wf.agents_ready(1)
    wait_until(lambda: "outcome" in wf.job().task_tokens, what="outcome wait registered")
    wf.store.update_job(job.job_id, lambda j: j.model_copy(update={
        "spec": {**j.spec, "budget": {"max_total_cost": 1}}, "cost_so_far": 5.0}))
    assert reconcile.handler(load_event("scheduled_event.json"), ctx())["over_budget"] == [job.job_id]
    assert wf.job().stop_save_by is not None
    wf.market.prices.update(CHEAP_SPOT)  # a move to spot would pay now
    reviews = wf.states_entered(arn).count("Review")
    wait_until(lambda: wf.states_entered(arn).count("Review") >= reviews + 2, what="two reviews during the save")
    assert "Migrate" not in wf.states_entered(arn) and len(wf.compute.launched) == 1
    wf.exit_all(first, 75)
    assert wf.finished(arn)["status"] == "FAILED"
    assert wf.job().status is JobStatus.FAILED and len(wf.compute.launched) == 1
