"""Notifications with context: what happened to a job and what it cost (SNS; Slack subscribes).

Kinds: submitted, started, interrupted, recovered, succeeded, failed, rejected, cancelled.
A failed publish is logged, never raised: telling people must not break the job.
"""

from __future__ import annotations

import logging
from typing import Any

from spotrelay.domain.models import Job
from spotrelay.ports.notifier import Notifier

log = logging.getLogger(__name__)

KINDS = ("submitted", "started", "interrupted", "recovered", "succeeded", "failed", "rejected", "cancelled",
         "anomaly")

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
}


def job_context(job: Job, now: float, **extra: Any) -> dict[str, Any]:
    """The numbers people ask about: attempt, steps lost, checkpoint age, cost so far."""
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
        "checkpoint_step": ckpt.step if ckpt else None,
        "checkpoint_age_s": round(now - ckpt.committed_at, 1) if ckpt else None,
        "cost_so_far": round(job.cost_so_far, 2),
    }
    if job.reasons:
        context["reasons"] = list(job.reasons)
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
          "cancelled": ":octagonal_sign:", "anomaly": ":stethoscope:"}
_FIELDS = (("attempt", "Attempt"), ("pool", "Pool"), ("steps_lost", "Steps lost"),
           ("checkpoint_step", "Checkpoint step"), ("checkpoint_age_s", "Checkpoint age (s)"),
           ("cost_so_far", "Cost so far (USD)"), ("reason", "Reason"))


def slack_payload(message: dict[str, Any], channel: str | None = None) -> dict[str, Any]:
    """A Slack incoming-webhook body for one SNS message published by :func:`announce`."""
    kind = str(message.get("kind", "event"))
    context = message.get("context") or {}
    subject = str(message.get("subject") or f"spotrelay: job {message.get('job_id')} {kind}")
    facts = [f"*{label}:* {context[key]}" for key, label in _FIELDS if context.get(key) not in (None, "")]
    for reason in context.get("reasons", [])[-2:]:
        facts.append(f"*Why:* {reason}")
    text = f"{_EMOJI.get(kind, ':information_source:')} {subject}"
    body: dict[str, Any] = {
        "text": text,
        "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": text}}],
    }
    if facts:
        body["blocks"].append({"type": "section", "text": {"type": "mrkdwn", "text": "\n".join(facts)}})
    body["blocks"].append({"type": "context", "elements": [
        {"type": "mrkdwn", "text": f"job `{message.get('job_id')}`"}]})
    if channel:
        body["channel"] = channel
    return body
