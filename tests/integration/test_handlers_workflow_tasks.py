"""The workflow's Lambda tasks called twice (a Step Functions retry, a Lambda redelivery): the
second call finds the first one's work and changes nothing."""

from __future__ import annotations

from typing import Any

import pytest

from functions import sfn_finalize, sfn_plan, sfn_provision, sfn_recover, sfn_teardown
from spotrelay.domain.cost import stop_lead_s
from spotrelay.domain.models import Attempt, NodeState, Pool
from spotrelay.domain.status import JobStatus
from spotrelay.errors import BudgetExceededError
from tests.integration.controller_doubles import Env, ctx, env, new_job, running_job

__all__ = ["env"]
TIMINGS = {"backoff_s": 5, "backoff_max_s": 60}


def test_plan_and_provision_twice_launch_once(env: Env) -> None:
    job = new_job(env.store)
    plan = sfn_plan.handler({"job_id": job.job_id, "timings": TIMINGS}, ctx())
    assert plan == sfn_plan.handler({"job_id": job.job_id, "timings": TIMINGS}, ctx())
    assert env.store.get_job(job.job_id).status is JobStatus.PLACING
    first = sfn_provision.handler({"job_id": job.job_id, "plan": plan}, ctx())
    again = sfn_provision.handler({"job_id": job.job_id, "plan": plan}, ctx())
    assert first == again and first["attempt"] == 1 and first["nodes"] == 2
    assert len(env.compute.launched) == 1 and len(env.store.nodes_of(job.job_id)) == 2


def test_recover_twice_charges_the_budget_once(env: Env) -> None:
    job, gang = running_job(env.store, env.compute, tokens={})
    env.store.update_node(job.job_id, "a1-r1", lambda n: n.model_copy(update={"state": NodeState.LOST}))
    event = {"job_id": job.job_id, "timings": TIMINGS, "outcome": {"outcome": "node-lost", "attempt": 1}}
    first = sfn_recover.handler(event, ctx())
    assert first["outcome"] == "node-lost" and first["backoff_s"] == 5 and first["keep_instance_ids"] == []
    again = sfn_recover.handler(event, ctx())
    assert again["backoff_s"] == first["backoff_s"] and again["recoveries"] == 1
    current = env.store.get_job(job.job_id)
    assert current.status is JobStatus.RECOVERING and current.recoveries == 1
    assert current.excluded_pools == [gang[0].pool.key]  # re-plan without the pool that failed
    assert current.attempts[0].end_reason == "node-lost" and current.attempts[0].ended_at is not None
    assert env.compute.running(job.job_id) == []  # replace-cluster releases the survivor too


def test_finalize_twice_finishes_and_notifies_once(env: Env) -> None:
    job, _gang = running_job(env.store, env.compute)
    error = {"Error": "RetryBudgetExhaustedError", "Cause": '{"errorMessage": "recoveries spent"}'}
    first = sfn_finalize.handler({"job_id": job.job_id, "result": "FAILED", "error": error}, ctx())
    assert first["status"] == "FAILED" and first["changed"] is True
    second = sfn_finalize.handler({"job_id": job.job_id, "result": "FAILED", "error": error}, ctx())
    assert second == {"status": "FAILED", "changed": False}
    final = env.store.get_job(job.job_id)
    assert final.reasons == ["RetryBudgetExhaustedError: recoveries spent"]
    assert final.attempts[0].ended_at is not None and final.cost_so_far > 0


def test_teardown_twice_ends_the_live_records_and_keeps_how_the_others_ended(env: Env) -> None:
    """Teardown and reconcile's stuck sweep end node records alike (``end_records``): live ones
    TERMINATED before the instances go, LOST and EXITED ones keep what they say."""
    job, gang = running_job(env.store, env.compute, nodes=3)
    env.store.update_node(job.job_id, "a1-r1", lambda n: n.model_copy(update={"state": NodeState.LOST}))
    env.store.update_node(job.job_id, "a1-r2", lambda n: n.model_copy(update={"state": NodeState.EXITED}))
    first = sfn_teardown.handler({"job_id": job.job_id}, ctx())
    assert sorted(first["terminated"]) == sorted(n.instance_id for n in gang)
    sfn_teardown.handler({"job_id": job.job_id}, ctx())
    states = {n.node_id: n.state for n in env.store.nodes_of(job.job_id)}
    assert states == {"a1-r0": NodeState.TERMINATED, "a1-r1": NodeState.LOST, "a1-r2": NodeState.EXITED}
    assert env.compute.running(job.job_id) == []


def test_finalize_of_a_cancelling_job_is_cancelled(env: Env) -> None:
    job, _gang = running_job(env.store, env.compute)
    env.store.update_job(job.job_id, lambda j: j.model_copy(update={"status": JobStatus.CANCELLING}))
    assert sfn_finalize.handler({"job_id": job.job_id, "result": "FAILED", "error": None}, ctx())["status"] == (
        "CANCELLED")


def test_survivors_a_failed_keeping_plan_drops_drain_while_they_may_still_save(env: Env) -> None:
    import time

    job, gang = running_job(env.store, env.compute, status=JobStatus.RECOVERING)
    home = gang[0].pool
    # the replacement for rank 0 did not fit in the survivors' pool (provision excluded it)
    env.store.update_job(job.job_id, lambda j: j.model_copy(update={"excluded_pools": [home.key]}))
    recovery = {"action": "replace-lost", "outcome": "interrupted", "pool": home.model_dump(),
                "keep_instance_ids": [gang[1].instance_id], "launch_ranks": [0], "deadline": time.time() + 300}
    sfn_plan.handler({"job_id": job.job_id, "timings": TIMINGS, "recovery": recovery}, ctx())
    survivor = env.store.get_node(job.job_id, gang[1].node_id)
    assert survivor.release_after == recovery["deadline"] and survivor.state is NodeState.READY
    assert gang[1].instance_id in env.compute.running(job.job_id)  # not terminated mid-save
    # without a save to wait for (no deadline), dropped survivors go at once
    recovery["deadline"] = None
    env.store.update_node(job.job_id, gang[1].node_id, lambda n: n.model_copy(update={"release_after": None}))
    sfn_plan.handler({"job_id": job.job_id, "timings": TIMINGS, "recovery": recovery}, ctx())  # a re-plan
    assert gang[1].instance_id not in env.compute.running(job.job_id)


def test_a_shrunk_gang_grows_back_in_place_and_the_kept_rank_restarts_at_the_new_world_size(env: Env) -> None:
    job, gang = running_job(env.store, env.compute, nodes=1)  # a gang of 1 of a 2-node job (min_nodes 1)
    env.store.update_job(job.job_id, lambda j: j.model_copy(update={
        "spec": {**j.spec, "resources": {**j.spec["resources"], "min_nodes": 1}},
        "attempts": [j.attempts[0].model_copy(update={"world_size": 1})]}))
    home = gang[0].pool
    move = {"outcome": "migrate", "attempt": 1, "reason": "grow back", "lost_ranks": [],
            "target": {"pool": home.model_dump(), "price_per_hour": 30.0, "score": 1.0, "nodes": 2}}
    first = sfn_provision.handler({"job_id": job.job_id, "move": move}, ctx())
    assert first == sfn_provision.handler({"job_id": job.job_id, "move": move}, ctx())  # a retry: one launch
    assert first["attempt"] == 2 and first["world_size"] == 2
    assert [(r.ranks, r.gang) for r in env.compute.launched[1:]] == [([1], 2)]  # only the new rank boots, once
    old = env.store.get_node(job.job_id, "a1-r0")
    kept = env.store.get_node(job.job_id, "a2-r0")
    assert old.directive and old.directive["kind"] == "CHECKPOINT_NOW" and old.state is NodeState.READY
    assert kept.instance_id == gang[0].instance_id and kept.directive
    assert kept.directive["kind"] == "RESTART" and kept.directive["world_size"] == 2
    moved = env.store.get_job(job.job_id)
    assert moved.status is JobStatus.STARTING and moved.recoveries == 0
    assert moved.attempts[0].end_reason == "migrate" and moved.attempts[1].world_size == 2
    assert moved.attempts[1].kept == 1  # rank 0 carried over: the spot evidence bills it once


def test_a_survivor_noticed_after_recover_joins_the_new_attempt_doomed(env: Env) -> None:
    """One reclaim of several nodes, its notices handled one by one: recover kept rank 1 on the first
    notice, rank 1's own notice came before provision. It joins doomed, so the ready wait ends at once
    (interrupted before training) instead of a gang that reports ready and then loses rank 1 unsaved
    (the simulator saw such a gang wait a day with its nodes billed)."""
    import time

    from spotrelay.domain.models import Job
    from spotrelay.services.waits import ready_verdict

    job, gang = running_job(env.store, env.compute, status=JobStatus.RECOVERING)
    home = gang[0].pool
    recovery = {"action": "replace-lost", "outcome": "interrupted", "pool": home.model_dump(),
                "keep_instance_ids": [gang[1].instance_id], "launch_ranks": [0]}
    plan = sfn_plan.handler({"job_id": job.job_id, "timings": TIMINGS, "recovery": recovery}, ctx())
    reclaim = time.time() + 110
    env.store.update_node(job.job_id, gang[1].node_id, lambda n: n.model_copy(
        update={"state": NodeState.DOOMED, "reclaim_at": reclaim}))
    launched = sfn_provision.handler({"job_id": job.job_id, "plan": plan}, ctx())
    assert launched["attempt"] == 2
    assert env.store.get_job(job.job_id).attempts[-1].kept == 1  # rank 1 carried, rank 0 launched
    carried = env.store.get_node(job.job_id, "a2-r1")
    assert carried.instance_id == gang[1].instance_id
    assert carried.state is NodeState.DOOMED and carried.reclaim_at == reclaim
    now: Job = env.store.get_job(job.job_id)
    nodes = [n for n in env.store.nodes_of(job.job_id) if n.attempt == 2]
    verdict = ready_verdict(now, nodes)
    assert verdict is not None and verdict.outcome.value == "interrupted" and 1 in verdict.lost_ranks


def test_the_attempt_record_carries_placements_loss_interval_for_the_trainers(env: Env) -> None:
    """``checkpoint.every_minutes: auto``: the agent reads its attempt's loss interval (AttemptView)."""
    from spotrelay.contracts.agent import JobView

    job = new_job(env.store)
    plan = sfn_plan.handler({"job_id": job.job_id, "timings": TIMINGS}, ctx())
    chosen = plan["candidates"][0]
    assert chosen["loss_interval_s"] > 0  # every pool fails now and then (spot reclaims, hardware)
    sfn_provision.handler({"job_id": job.job_id, "plan": plan}, ctx())
    record = env.store.get_job(job.job_id)
    assert record.attempts[-1].loss_interval_s == chosen["loss_interval_s"]
    view = JobView.model_validate(record.model_dump(mode="json"))
    assert view.attempts[-1].loss_interval_s == chosen["loss_interval_s"]
    from spotrelay.services.describe import describe_job  # and `spotrelay describe --json` shows it

    report = describe_job(record, env.store.nodes_of(job.job_id), 2000.0)
    assert report.attempts[-1].loss_interval_s == chosen["loss_interval_s"]


def test_a_job_whose_notices_came_too_late_to_save_gets_a_shorter_loss_interval(env: Env) -> None:
    """Plan reads the job's own notices: where its ranks could not save in the notice's window (the
    agent's deadline-at-risk), those reclaims lose work too, and the auto cadence must hear of them."""
    job = new_job(env.store)
    before = sfn_plan.handler({"job_id": job.job_id, "timings": TIMINGS}, ctx())["candidates"][0]
    late = [Attempt(number=i + 1, pool=Pool.model_validate(before["pool"]), started_at=1000.0 * i,
                    ended_at=1000.0 * i + 900.0, end_reason="interrupted", notice_at_risk=True) for i in range(2)]
    env.store.update_job(job.job_id, lambda j: j.model_copy(update={"attempts": late, "attempt": 2}))
    after = sfn_plan.handler({"job_id": job.job_id, "timings": TIMINGS}, ctx())["candidates"][0]
    assert after["pool"] == before["pool"]
    assert after["loss_interval_s"] < before["loss_interval_s"]  # every reclaim counts, not a tenth


def test_plan_puts_a_job_behind_its_max_slowdown_on_on_demand(env: Env) -> None:
    """recovery.max_slowdown through Plan's handler: 10 hours in, a job whose spot gang committed one hour
    of training (at 1.5x on-demand's wall time, 6.7 hours were due) gets on-demand candidates only; the
    same history without the limit is offered spot first."""
    import time

    for job_id, limit in (("free", None), ("bounded", 1.5)):
        job = new_job(env.store, job_id=job_id, max_slowdown=limit)
        plan = sfn_plan.handler({"job_id": job.job_id, "timings": TIMINGS}, ctx())["candidates"]
        spot = next(Pool.model_validate(c["pool"]) for c in plan if c["pool"]["market"] == "spot")
        start = time.time() - 10 * 3600
        history = [Attempt(number=1, pool=spot, started_at=start, ended_at=start + 2 * 3600, end_reason="interrupted",
                           nodes=2, world_size=2, cost=1.0, resumed_from_step=0, resumed_at=start + 600,
                           saved_step=100, saved_at=start + 600 + 3600)]
        env.store.update_job(job.job_id, lambda j, h=history: j.model_copy(update={"attempts": h, "attempt": 1}))
        again = sfn_plan.handler({"job_id": job.job_id, "timings": TIMINGS}, ctx())["candidates"]
        if limit is None:
            assert again[0]["pool"]["market"] == "spot"
        else:
            assert {c["pool"]["market"] for c in again} == {"on-demand"}


def test_plan_offers_only_gangs_the_budget_left_pays_to_boot_and_save(env: Env) -> None:
    """Near its budget's end a gang the rest cannot pay to boot and save would be stopped by the first
    sweep after its boot, having trained nothing: Plan drops it, and with none left fails the job now."""
    job = new_job(env.store)
    free = sfn_plan.handler({"job_id": job.job_id, "timings": TIMINGS}, ctx())["candidates"]
    lead = stop_lead_s(60.0, None)  # the reconcile's minute and a save before one is measured

    def cost(c: dict[str, Any]) -> float:
        boot = env.compute.expected_boot_s(Pool(**c["pool"]))
        return float(c["price_per_hour"]) * int(c["nodes"]) * (boot + lead) / 3600

    costs = sorted(cost(c) for c in free)
    assert costs[0] < costs[-1]  # (the doubles' market prices its pools apart)

    def budget(left: float) -> None:
        env.store.update_job(job.job_id, lambda j: j.model_copy(update={
            "spec": {**j.spec, "budget": {"max_total_cost": 40.0 + left}}, "cost_so_far": 40.0}))

    budget((costs[0] + costs[-1]) / 2)
    kept = sfn_plan.handler({"job_id": job.job_id, "timings": TIMINGS}, ctx())["candidates"]
    assert kept and all(cost(c) < (costs[0] + costs[-1]) / 2 for c in kept) and len(kept) < len(free)
    budget(costs[0] * 0.99)
    with pytest.raises(BudgetExceededError, match=r"the \$[\d.,]+ left of the \$[\d.,]+ budget would not pay for "
                                                  r"a gang to boot and save"):
        sfn_plan.handler({"job_id": job.job_id, "timings": TIMINGS}, ctx())


def test_a_job_with_more_attempts_than_an_item_holds_keeps_launching(env: Env) -> None:
    """DynamoDB (moto too) refuses an item over 400 KB: ~650 attempts of 600 bytes. Provision folds the oldest attempt
    out of a record at ATTEMPTS_KEPT (services/history.py), so a job on a stormy market for months keeps
    its record writable; what the folded attempts cost stays in the job's totals."""
    from botocore.exceptions import ClientError

    from spotrelay.services.history import ATTEMPTS_KEPT, kept

    job = new_job(env.store)
    plan = sfn_plan.handler({"job_id": job.job_id, "timings": TIMINGS}, ctx())
    spot = next(Pool.model_validate(c["pool"]) for c in plan["candidates"] if c["pool"]["market"] == "spot")

    def attempt(n: int) -> Attempt:
        t = 1.79e9 + n * 1800.0
        return Attempt(number=n, pool=spot, started_at=t, ended_at=t + 1700.0, end_reason="interrupted",
                       resumed_from_step=10 * n, resumed_at=t + 400.0, saved_step=10 * n + 9, saved_at=t + 1600.0,
                       reached_step=10 * n + 9, lost_steps=0, cost=123.456789, drain_cost=1.2345, unbilled=0.5,
                       price_per_hour=31.4643567, price_in_effect=31.2345678, price_checked_at=t, nodes=16,
                       world_size=16, loss_interval_s=3600.5)

    many = [attempt(n) for n in range(1, 901)]
    with pytest.raises(ClientError, match="maximum allowed size"):  # every attempt kept: refused
        env.store.update_job(job.job_id, lambda j: j.model_copy(update={"attempts": many, "attempt": 900}))
    attempts, earlier = kept(many, None)
    env.store.update_job(job.job_id, lambda j: j.model_copy(update={"attempts": attempts, "earlier": earlier,
                                                                    "attempt": 900}))
    launched = sfn_provision.handler({"job_id": job.job_id, "plan": plan}, ctx())
    assert launched["attempt"] == 901
    record = env.store.get_job(job.job_id)
    assert len(record.attempts) == ATTEMPTS_KEPT and record.attempts[-1].number == 901
    assert record.earlier is not None and record.earlier.count == 901 - ATTEMPTS_KEPT
    assert record.earlier.first_resumed_from_step == 10 and record.earlier.first_started_at == many[0].started_at


def test_a_hand_over_the_job_record_cannot_follow_stops_the_new_execution(env: Env, monkeypatch: Any) -> None:
    """One execution drives a job at a time: the next one started, the record could not be pointed at it,
    so it is stopped and the task fails (the ASL's catch goes on in the last execution)."""
    from functions import sfn_handover
    from spotrelay.errors import ConflictError

    job = new_job(env.store)
    data = {"job_id": job.job_id, "hops": {"count": 250}, "timings": {"max_hops": 250}}
    done = sfn_handover.handler({"job_id": job.job_id, "resume_at": "review", "data": data}, ctx())
    arn = done["execution_arn"]
    assert arn.endswith(f":{job.job_id}-h1-250") and env.store.get_job(job.job_id).execution_arn == arn
    assert env.workflow.inputs[arn]["resume_at"] == "review" and env.workflow.inputs[arn]["hops"]["count"] == 0

    def refused(*args: Any, **kwargs: Any) -> None:
        raise ConflictError("the job changed under the write")

    monkeypatch.setattr(type(env.store), "update_job", refused)  # (the handler's store is its own instance)
    later = {**data, "hops": {"count": 251, "generation": 0}}
    with pytest.raises(Exception, match="not recorded"):
        sfn_handover.handler({"job_id": job.job_id, "resume_at": "plan", "data": later}, ctx())
    stopped = [a for a, status in env.workflow.executions.items() if status == "ABORTED"]
    assert stopped == [arn.replace("-h1-250", "-h1-251")]


def test_provision_names_the_specs_checkpoint_prefix_and_dataset_for_the_nodes_role(env: Env) -> None:
    """A resumed job's spec points checkpoint.s3_prefix at the stopped job's checkpoints: each launch
    request carries it, so the compute adapter's per-job policy grants that prefix (not only the job's own)."""
    job = new_job(env.store)
    plain = sfn_plan.handler({"job_id": job.job_id, "timings": TIMINGS}, ctx())
    sfn_provision.handler({"job_id": job.job_id, "plan": plain}, ctx())
    assert env.compute.launched[-1].checkpoint_prefix == ""
    resumed = new_job(env.store, job_id="job-resumed")
    spec = {**resumed.spec, "checkpoint": {**resumed.spec["checkpoint"], "s3_prefix": "s3://bkt/checkpoints/old/"},
            "dataset": {"uri": "s3://acme-ml-data/corpus/", "replicas": {"us-west-2": "s3://acme-usw2/corpus/"}}}
    env.store.save_job(resumed.model_copy(update={"spec": spec}), resumed.status, resumed.version)
    plan = sfn_plan.handler({"job_id": "job-resumed", "timings": TIMINGS}, ctx())
    sfn_provision.handler({"job_id": "job-resumed", "plan": plan}, ctx())
    request = env.compute.launched[-1]
    assert request.job_id == "job-resumed" and request.checkpoint_prefix == "s3://bkt/checkpoints/old/"
    assert request.config_uri.endswith("/submissions/job-resumed.yaml")
    assert request.dataset_uris == ["s3://acme-ml-data/corpus/", "s3://acme-usw2/corpus/"]  # read by the training
