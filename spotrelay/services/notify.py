"""Notifications with context: what happened to a job and what it cost (SNS; Slack subscribes).

Kinds: submitted, started, interrupted, recovered, succeeded, failed, rejected, cancelled, anomaly,
budget (the budget is nearly spent: services/budget.py).
A failed publish is logged, never raised: telling people must not break the job.
"""

from __future__ import annotations

import logging
from typing import Any

from spotrelay.domain.cost import spent_at
from spotrelay.domain.models import Job
from spotrelay.ports.notifier import Notifier
from spotrelay.services import history, savings

log = logging.getLogger(__name__)

KINDS = ("submitted", "started", "interrupted", "recovered", "succeeded", "failed", "rejected", "cancelled",
         "anomaly", "budget")

_SUBJECTS = {
    "started": "job {name} is running (attempt {attempt})",
    "recovered": "job {name} recovered (attempt {attempt})",
    "interrupted": "job {name} interrupted: {reason}",
    "succeeded": "job {name} succeeded",
    "failed": "job {name} failed",
    "cancelled": "job {name} cancelled",
    "submitted": "job {name} submitted",
    "rejected": "job {name} rejected",
    "anomaly": "job {name}: {reason}",
    "budget": "job {name} budget: {reason}",
}


def recovery_downtime(job: Job, now: float) -> float | None:
    """Seconds from the end of the previous attempt until ``now``; None on the first attempt."""
    ended = [a.ended_at for a in job.attempts if a.number < job.attempt and a.ended_at]
    return round(max(0.0, now - max(ended)), 1) if ended else None


def total_downtime(job: Job) -> float:
    """Seconds without training between attempts (each gap from an attempt's end to the next start)."""
    return round(history.downtime_s(job.attempts, job.earlier), 1)


def console_url(execution_arn: str | None) -> str | None:
    """The Step Functions console page of the job's execution."""
    if not execution_arn or execution_arn.count(":") < 6:
        return None
    region = execution_arn.split(":")[3]
    return (f"https://{region}.console.aws.amazon.com/states/home?region={region}"
            f"#/v2/executions/details/{execution_arn}")


def job_context(job: Job, now: float, **extra: Any) -> dict[str, Any]:
    """The numbers people ask about: attempt, pool, steps lost, downtime, checkpoint age, cost so far,
    and where to look (the execution in the console)."""
    current = job.attempts[-1] if job.attempts else None
    ckpt = job.last_checkpoint
    context: dict[str, Any] = {
        "job_id": job.job_id,
        "name": job.name,
        "status": job.status.value,
        "attempt": job.attempt,
        "recoveries": job.recoveries,
        "pool": current.pool.key if current and current.pool else None,
        "last_step": job.last_step,
        "steps_lost": job.steps_lost,
        "downtime_s": total_downtime(job),
        "checkpoint_step": ckpt.step if ckpt else None,
        "checkpoint_age_s": round(now - ckpt.committed_at, 1) if ckpt else None,
        # a live job's running attempt counts its clock so far (describe.cost_report, the budget's figure)
        "cost_so_far": round(job.cost_so_far if job.status.terminal else spent_at(job.cost_so_far, current, now), 2),
        "console_url": console_url(job.execution_arn),
    }
    if job.status.terminal:
        # what its instance-hours would have cost on on-demand (services/savings.py): the job's spot saving
        paid, on_demand = history.paid_and_on_demand(job.attempts, job.earlier)
        if on_demand:
            context["on_demand_usd"] = round(on_demand, 2)
            context["saved_vs_on_demand"] = savings.saved_share(paid, on_demand)
    if job.reasons:
        context["reasons"] = list(job.reasons)
    channel = (job.spec or {}).get("notifications", {}).get("slack_channel")
    if channel:  # (the Slack notifier posts there; the deployment's webhook decides without it)
        context["slack_channel"] = channel
    context.update(extra)
    return context


def topic_for(job: Job) -> str | None:
    """The spec may send a job's messages to its own topic; None means the default topic."""
    topic = job.spec.get("notifications", {}).get("sns_topic_arn") if job.spec else None
    return str(topic) if topic else None


def announce(notifier: Notifier | None, kind: str, job: Job, now: float, **extra: Any) -> dict[str, Any] | None:
    """Publish one message; returns the context sent (None when there is no notifier)."""
    if notifier is None:
        return None
    context = job_context(job, now, kind=kind, **extra)
    subject = "spotrelay: " + _SUBJECTS.get(kind, "job {name}: " + kind).format(
        name=job.name, attempt=job.attempt, reason=extra.get("reason", "capacity reclaimed"))
    try:
        notifier.notify(kind, job.job_id, subject, context, topic_arn=topic_for(job))
    except Exception:
        log.exception("notification failed", extra={"job_id": job.job_id, "kind": kind})
    return context


_EMOJI = {"succeeded": ":white_check_mark:", "failed": ":x:", "rejected": ":no_entry:", "interrupted": ":warning:",
          "recovered": ":arrows_counterclockwise:", "started": ":rocket:", "submitted": ":inbox_tray:",
          "cancelled": ":octagonal_sign:", "anomaly": ":stethoscope:", "budget": ":moneybag:"}
_FIELDS = (("attempt", "Attempt"), ("pool", "Pool"), ("steps_lost", "Steps lost"),
           ("checkpoint_step", "Checkpoint step"), ("checkpoint_age_s", "Checkpoint age (s)"),
           ("downtime_s", "Downtime (s)"), ("cost_so_far", "Cost so far (USD)"),
           ("on_demand_usd", "Same hours on on-demand (USD)"), ("saved_vs_on_demand", "Saved vs on-demand"),
           ("reason", "Reason"), ("advice", "Advice"))


def _shown(key: str, value: Any) -> str:
    if key == "saved_vs_on_demand" and isinstance(value, int | float):
        return f"{value:.0%}"
    return str(value)


def slack_payload(message: dict[str, Any], channel: str | None = None) -> dict[str, Any]:
    """A Slack incoming-webhook body for one SNS message published by :func:`announce`; to ``channel``,
    else the job spec's ``notifications.slack_channel`` (carried in the message), else the webhook's own."""
    kind = str(message.get("kind", "event"))
    context = message.get("context") or {}
    channel = channel or context.get("slack_channel")
    subject = str(message.get("subject") or f"spotrelay: job {message.get('job_id')} {kind}")
    facts = [f"*{label}:* {_shown(key, context[key])}" for key, label in _FIELDS if context.get(key) not in (None, "")]
    for reason in context.get("reasons", [])[-2:]:
        facts.append(f"*Why:* {reason}")
    text = f"{_EMOJI.get(kind, ':information_source:')} {subject}"
    body: dict[str, Any] = {
        "text": text,
        "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": text}}],
    }
    if facts:
        body["blocks"].append({"type": "section", "text": {"type": "mrkdwn", "text": "\n".join(facts)}})
    where = f"job `{message.get('job_id')}`"
    if context.get("console_url"):
        where += f" | <{context['console_url']}|execution in the console>"
    body["blocks"].append({"type": "context", "elements": [{"type": "mrkdwn", "text": where}]})
    if channel:
        body["channel"] = channel
    return body
