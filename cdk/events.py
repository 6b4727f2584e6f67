"""EventBridge rules from spotrelay.resources.RULES (the twin builds the same), each with a DLQ and
a retry policy, and the reconcile schedule."""

from __future__ import annotations

from typing import Any

from aws_cdk import Duration
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from cdk import nag
from cdk.config import AppConfig, InfraConfigError
from spotrelay.resources import RESOURCES, Rule

# EventBridge keeps retrying a failed delivery for this long, then parks the event in the DLQ.
MAX_EVENT_AGE = Duration.hours(2)
RETRY_ATTEMPTS = 20
_PATTERN_KEYS = {
    "source": "source",
    "detail-type": "detail_type",
    "detail": "detail",
    "account": "account",
    "region": "region",
    "resources": "resources",
}


def event_pattern(pattern: dict[str, Any]) -> events.EventPattern:
    """Map the shared description's JSON pattern onto CDK's EventPattern (same JSON once synthesized)."""
    unknown = set(pattern) - set(_PATTERN_KEYS)
    if unknown:
        raise InfraConfigError(f"event pattern keys not supported: {sorted(unknown)}")
    return events.EventPattern(**{_PATTERN_KEYS[key]: value for key, value in pattern.items()})


def dead_letter_queue(scope: Construct, id: str, key: kms.IKey | None = None) -> sqs.Queue:
    """With ``key`` (the home stack's customer key, whose policy lets EventBridge use it) the queue is
    encrypted with it; without (training regions hold no key), with SQS-owned keys (cdk/checkov.py)."""
    queue = sqs.Queue(
        scope,
        id,
        encryption=sqs.QueueEncryption.KMS if key else sqs.QueueEncryption.SQS_MANAGED,
        encryption_master_key=key,
        enforce_ssl=True,
        retention_period=Duration.days(14),
    )
    nag.acknowledge(queue, "AwsSolutions-SQS3", "this queue is itself the dead-letter queue of an EventBridge target")
    return queue


class Events(Construct):
    """One rule per RULES entry on the default bus, plus the reconcile schedule."""

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        config: AppConfig,
        functions: dict[str, lambda_.IFunction],
        state_machine: sfn.IStateMachine | None,
        rules: tuple[Rule, ...] = RESOURCES.rules,
        key: kms.IKey | None = None,
    ) -> None:
        super().__init__(scope, id)
        self.rules: dict[str, events.Rule] = {}
        self.dlqs: dict[str, sqs.Queue] = {}
        for spec in rules:
            dlq = dead_letter_queue(self, f"{spec.logical}Dlq", key)
            target: events.IRuleTarget
            if spec.handler is None:
                if state_machine is None:
                    raise InfraConfigError(f"rule {spec.logical} targets the state machine, none given")
                target = targets.SfnStateMachine(
                    state_machine, dead_letter_queue=dlq, max_event_age=MAX_EVENT_AGE, retry_attempts=RETRY_ATTEMPTS
                )
            else:
                fn = functions.get(spec.handler)
                if fn is None:
                    # a rule without its handler would drop events silently: fail the synth instead
                    raise InfraConfigError(f"rule {spec.logical} needs functions/{spec.handler}.py with a handler")
                target = targets.LambdaFunction(
                    fn, dead_letter_queue=dlq, max_event_age=MAX_EVENT_AGE, retry_attempts=RETRY_ATTEMPTS
                )
            self.rules[spec.logical] = events.Rule(
                self,
                spec.logical,
                rule_name=f"{config.prefix}-{spec.logical}",
                description=spec.description,
                event_pattern=event_pattern(spec.pattern),
                targets=[target],
            )
            self.dlqs[spec.logical] = dlq

        reconcile = functions.get("reconcile")
        if reconcile is not None:
            dlq = dead_letter_queue(self, "ReconcileDlq", key)
            self.rules["Reconcile"] = events.Rule(
                self,
                "Reconcile",
                rule_name=f"{config.prefix}-Reconcile",
                description=f"every {config.reconcile_minutes} min: stale heartbeats, orphan instances, idle "
                "clusters, stuck executions",
                schedule=events.Schedule.rate(Duration.minutes(config.reconcile_minutes)),
                targets=[
                    targets.LambdaFunction(
                        reconcile,
                        dead_letter_queue=dlq,
                        # a missed tick is replaced by the next one: do not pile them up
                        max_event_age=Duration.minutes(max(2, config.reconcile_minutes)),
                        retry_attempts=2,
                    )
                ],
            )
            self.dlqs["Reconcile"] = dlq
