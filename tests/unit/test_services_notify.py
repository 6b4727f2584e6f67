"""Notification context and the Slack message built from it."""

from __future__ import annotations

from typing import Any

from spotrelay.domain.models import Attempt, CheckpointRef, Job, Pool
from spotrelay.domain.status import JobStatus
from spotrelay.services.notify import announce, job_context, recovery_downtime, slack_payload, topic_for

POOL = Pool(region="us-west-2", az="us-west-2b", instance_type="p4d.24xlarge", market="spot")


def _job(**update: Any) -> Job:
    base = Job(job_id="j-1", name="llm", status=JobStatus.RUNNING, attempt=3, recoveries=2, steps_lost=12,
               last_step=900, cost_so_far=1234.567, attempts=[Attempt(number=3, pool=POOL)],
               last_checkpoint=CheckpointRef(step=888, uri="s3://b/x", committed_at=100.0))
    return base.model_copy(update=update)


class Recorder:
    def __init__(self, fail: bool = False) -> None:
        self.sent: list[tuple[str, str, str, dict[str, Any], str | None]] = []
        self.fail = fail

    def notify(self, kind: str, job_id: str, subject: str, context: dict[str, Any],
               topic_arn: str | None = None) -> None:
        if self.fail:
            raise RuntimeError("sns down")
        self.sent.append((kind, job_id, subject, context, topic_arn))


def test_context_has_what_people_ask() -> None:
    context = job_context(_job(), now=160.0)
    assert context["attempt"] == 3 and context["steps_lost"] == 12 and context["cost_so_far"] == 1234.57
    assert context["checkpoint_age_s"] == 60.0 and context["pool"] == POOL.key


def test_announce_uses_the_spec_topic_and_survives_failures() -> None:
    topic = "arn:aws:sns:us-east-1:123456789012:team-ml"
    job = _job(spec={"notifications": {"sns_topic_arn": topic}})
    assert topic_for(job) == topic
    rec = Recorder()
    announce(rec, "recovered", job, 160.0)
    assert rec.sent[0][2] == "spotrelay: job llm recovered (attempt 3)" and rec.sent[0][4] == topic
    assert announce(Recorder(fail=True), "failed", job, 0.0) is not None
    assert announce(None, "failed", job, 0.0) is None


def test_slack_payload() -> None:
    body = slack_payload({"kind": "succeeded", "job_id": "j-1", "subject": "spotrelay: job llm succeeded",
                          "context": job_context(_job(), 160.0)}, channel="#ml")
    assert body["text"] == ":white_check_mark: spotrelay: job llm succeeded" and body["channel"] == "#ml"
    facts = body["blocks"][1]["text"]["text"]
    assert "*Steps lost:* 12" in facts and "*Pool:* us-west-2/us-west-2b/p4d.24xlarge/spot" in facts


def test_messages_carry_downtime_and_the_execution_link() -> None:
    arn = "arn:aws:states:us-west-2:123456789012:execution:spotrelay-job-run:j-1"
    attempts = [Attempt(number=1, pool=POOL, started_at=0.0, ended_at=100.0),
                Attempt(number=2, pool=POOL, started_at=160.0, ended_at=300.0),
                Attempt(number=3, pool=POOL, started_at=340.0)]
    job = _job(attempts=attempts, execution_arn=arn)
    context = job_context(job, now=400.0)
    assert context["downtime_s"] == 100.0  # 60 s + 40 s between attempts
    assert context["console_url"].startswith("https://us-west-2.console.aws.amazon.com/states/home?region=us-west-2")
    assert context["console_url"].endswith(arn)
    body = slack_payload({"kind": "recovered", "job_id": "j-1", "subject": "s", "context": context})
    assert "*Downtime (s):* 100.0" in body["blocks"][1]["text"]["text"]
    assert "execution in the console" in body["blocks"][2]["elements"][0]["text"]
    assert recovery_downtime(job, now=350.0) == 50.0 and recovery_downtime(_job(attempt=1), 1.0) is None


def test_a_finished_jobs_message_says_what_its_hours_would_have_cost_on_on_demand() -> None:
    from spotrelay.placement import catalog

    od = catalog.on_demand_price("us-west-2", "p4d.24xlarge")
    assert od is not None
    attempts = [Attempt(number=1, pool=POOL, nodes=2, price_per_hour=8.0, started_at=0.0, ended_at=3600.0,
                        cost=16.0, drain_cost=0.5),
                Attempt(number=2, pool=POOL, nodes=2, price_per_hour=8.0, started_at=4000.0, ended_at=7600.0,
                        cost=16.0)]
    done = _job(status=JobStatus.SUCCEEDED, attempts=attempts, cost_so_far=32.5)
    context = job_context(done, now=8000.0)
    hours = 32.5 / 8.0  # the billed instance-hours, drains included
    assert context["on_demand_usd"] == round(hours * od, 2)
    assert context["saved_vs_on_demand"] == round(1 - 32.5 / (hours * od), 4)
    facts = slack_payload({"kind": "succeeded", "job_id": "j-1", "context": context})["blocks"][1]["text"]["text"]
    assert f"*Saved vs on-demand:* {1 - 8.0 / od:.0%}" in facts
    assert "on_demand_usd" not in job_context(_job(), now=160.0)  # a live job: describe / cost have it
    # a prewarmed standby's $7.50 is in the job's total, in no attempt: the share compares the attempts' hours
    assert job_context(done.model_copy(update={"cost_so_far": 40.0}), 8000.0)["saved_vs_on_demand"] == \
        context["saved_vs_on_demand"]
