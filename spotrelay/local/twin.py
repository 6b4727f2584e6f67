"""The local twin: the whole controller on this machine (DESIGN.md section 7).

moto's server on 127.0.0.1 holds the resources the CDK app creates, built from the same description
(``spotrelay.resources``): tables, the jobs bucket with EventBridge notifications, the topic, one SQS
queue per EventBridge rule, and the job-run state machine from the same ASL file. Step Functions'
Lambda tasks and the rule targets both run our handlers in this process through the Lambda seam. The
Compute and MarketData ports are served by the local compute adapter (real agent processes) and the
market model.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spotrelay.local import lambda_seam, motoserver, provision
from spotrelay.local.compute import LocalCompute
from spotrelay.local.dispatcher import Dispatcher, Ticker, scheduled_event
from spotrelay.local.ec2_events import Ec2EventBus
from spotrelay.local.market import MarketModel
from spotrelay.local.throttle import Throttle
from spotrelay.resources import RESOURCES

log = logging.getLogger(__name__)

# Workflow waits for the twin: seconds, not minutes (read by WorkflowTimings.from_env()).
TWIN_TIMINGS = {
    "ready_timeout_s": 120,
    "heartbeat_s": 60,
    "outcome_timeout_s": 1800,
    "backoff_s": 1,
    "backoff_max_s": 5,
    "provision_retry_s": 2,
    "loss_settle_s": 1,
}

# The agents' polling in the twin: a real node polls IMDS every 2 s against a 120 s window; the twin's
# window is 30 s, so it polls and beats faster too.
TWIN_AGENT = {
    "imds_poll_s": "1",
    "directive_poll_s": "1",
    "heartbeat_s": "10",
    "rank0_wait_s": "120",
    "stop_grace_s": "10",
}


def queue_name(rule_logical: str) -> str:
    return f"spotrelay-{rule_logical.lower()}"


class RecordedMetrics:
    """The twin's metrics sink: (name, value, unit) in publication order."""

    def __init__(self) -> None:
        self.values: list[tuple[str, float, str]] = []

    def put(self, name: str, value: float, unit: str = "Count") -> None:
        self.values.append((name, value, unit))


@dataclass
class TwinOptions:
    root: Path
    market: MarketModel = field(default_factory=MarketModel)
    reconcile_every_s: float = 10.0  # the production schedule is one minute
    timings: dict[str, int] = field(default_factory=lambda: dict(TWIN_TIMINGS))
    agent_cmd: list[str] | None = None
    extra_env: dict[str, str] = field(default_factory=dict)  # for the controller and the agents
    moto: motoserver.MotoServer | None = None  # reuse a running server (tests); it is reset first
    code_dir: Path | None = None  # the job's code, put on every node's disk (default: the cwd)
    s3_mb_s: float | None = None  # the nodes reach S3 through a bandwidth throttle (MB/s, both ways)


class Twin:
    def __init__(self, options: TwinOptions) -> None:
        self.options = options
        self.root = options.root
        self.market = options.market
        self.moto: motoserver.MotoServer | None = None
        self.bus = Ec2EventBus()
        self.compute: LocalCompute | None = None
        self.dispatcher: Dispatcher | None = None
        self.ticker: Ticker | None = None
        self.state_machine_arn: str | None = None
        self.throttle: Throttle | None = None
        self.env: dict[str, str] = {}  # what a CLI or an agent needs to talk to this twin
        self.metrics = RecordedMetrics()  # the handlers' operator metrics
        self._saved_env: dict[str, str] | None = None

    # --- bring-up -----------------------------------------------------------------------------
    def workflow_env(self) -> dict[str, str]:
        """The workflow's timings (``WorkflowTimings.from_env``): the twin's short ones, and Plan's own
        waits (the wait for spot, its re-checks) at the market's ``time_scale``, the boots' scale."""
        timings = {"time_scale": self.market.time_scale, **self.options.timings}
        return {f"SPOTRELAY_WF_{k.upper()}": str(v) for k, v in timings.items()}

    def start(self) -> Twin:
        from spotrelay.settings import reset

        self.root.mkdir(parents=True, exist_ok=True)
        self._saved_env = dict(os.environ)
        os.environ.update(self.workflow_env())
        os.environ["SPOTRELAY_RECONCILE_S"] = str(self.options.reconcile_every_s)  # the budget stops a sweep ahead
        os.environ.update(self.options.extra_env)
        if self.options.moto is not None:
            self.moto = self.options.moto
            os.environ.update(self.moto.env())
            for key in (RESOURCES.topic_env, RESOURCES.state_machine_env):
                os.environ.pop(key, None)
            reset()
            self.moto.reset()
        else:
            self.moto = motoserver.start(apply_env=True)
            # moto's backends are per process, not per server: a twin started after another moto
            # server in this process (a test session) would find that server's tables and bucket
            self.moto.reset()
        created = provision.create_storage()
        os.environ[RESOURCES.topic_env] = created["topic_arn"]
        reset()
        routes = self._create_rules()
        self.compute = LocalCompute(
            self.market,
            self.root,
            agent_env={},
            agent_cmd=self.options.agent_cmd,
            bus=self.bus,
            code_dir=self.options.code_dir,
        )
        self._install_ports()
        self.state_machine_arn = self._create_workflow()
        os.environ[RESOURCES.state_machine_env] = self.state_machine_arn
        reset()
        self.env = self._env()
        self.compute.agent_env = {**self.env, **{f"SPOTRELAY_AGENT_{k.upper()}": v for k, v in TWIN_AGENT.items()}}
        if self.options.s3_mb_s:  # only the nodes' S3 (checkpoints) is slowed, not the controller
            self.throttle = Throttle("127.0.0.1", self.moto.port, self.options.s3_mb_s * 1e6).start()
            self.compute.agent_env["AWS_ENDPOINT_URL_S3"] = self.throttle.url
        self.dispatcher = Dispatcher(routes)
        self.dispatcher.start()
        reconcile = lambda_seam.register_module("reconcile")
        if reconcile:
            rule_arn = "arn:aws:events:us-east-1:123456789012:rule/spotrelay-reconcile"
            self.ticker = Ticker(
                self.options.reconcile_every_s,
                lambda: self.dispatcher.invoke(reconcile, scheduled_event(rule_arn)) if self.dispatcher else None,
            )
            self.ticker.start()
        log.info("twin up at %s", self.moto.url)
        return self

    def stop(self) -> None:
        if self.ticker:
            self.ticker.stop()
        if self.compute:
            self.compute.close()
        if self.dispatcher:
            self.dispatcher.stop()
        if self.throttle:
            self.throttle.stop()
        if self.moto and self.options.moto is None:
            self.moto.stop()
        self._restore()

    def _restore(self) -> None:
        """Give the process its environment and adapters back (tests run more after a twin)."""
        from spotrelay.settings import reset

        if self._saved_env is not None:
            os.environ.clear()
            os.environ.update(self._saved_env)
        try:
            from functions import _runtime

            _runtime.set_factories(compute=None, market=None, metrics=None)
        except ImportError:
            pass
        reset()

    def __enter__(self) -> Twin:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- pieces --------------------------------------------------------------------------------
    def _create_rules(self) -> dict[str, str]:
        """One queue per rule with a handler; rule -> queue; return queue URL -> function name."""
        from spotrelay.adapters.aws import client
        from spotrelay.settings import settings

        sqs, events = client("sqs"), client("events")
        bus = settings().event_bus
        routes: dict[str, str] = {}
        for rule in RESOURCES.rules:
            if rule.handler is None:  # targets the state machine directly; none today
                continue
            url = sqs.create_queue(QueueName=queue_name(rule.logical))["QueueUrl"]
            arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
            name = f"spotrelay-{rule.logical.lower()}"
            events.put_rule(
                Name=name,
                EventPattern=json.dumps(rule.pattern),
                State="ENABLED",
                Description=rule.description,
                EventBusName=bus,
            )
            events.put_targets(Rule=name, EventBusName=bus, Targets=[{"Id": "queue", "Arn": arn}])
            routes[url] = lambda_seam.register_module(rule.handler)
        return routes

    def _install_ports(self) -> None:
        """Point the controller's Compute and MarketData factories at the twin's adapters."""
        from functions import _runtime

        compute, market, metrics = self.compute, self.market, self.metrics
        # the handlers' operator metrics are kept in memory (EMF lines on stdout would garble the demo's view)
        _runtime.set_factories(compute=lambda: compute, market=lambda: market, metrics=lambda: metrics)

    def _create_workflow(self) -> str:
        """Lambda functions and the job-run state machine from the ASL file (the controller's setup)."""
        from spotrelay.local import workflow_setup

        return workflow_setup.create_workflow()

    def _env(self) -> dict[str, str]:
        assert self.moto is not None
        keep = [RESOURCES.topic_env, RESOURCES.state_machine_env, RESOURCES.bucket_env, RESOURCES.event_bus_env]
        keep += [t.env for t in RESOURCES.tables]
        env = {**self.moto.env(), **{k: os.environ[k] for k in keep if os.environ.get(k)}}
        env.update(self.options.extra_env)
        return env

    # --- helpers for the demo and the CLI --------------------------------------------------------
    def submit(self, spec_text: str, name: str) -> str:
        """Drop a spec under submissions/ (the S3 event starts everything); return the key."""
        from spotrelay.adapters.aws import client
        from spotrelay.settings import settings

        key = f"{RESOURCES.submissions_prefix}{name}"
        client("s3").put_object(Bucket=settings().bucket, Key=key, Body=spec_text.encode())
        return key

    def job_for_key(self, key: str) -> Any:
        """The job created for a submission key (None until the handler ran)."""
        from spotrelay.adapters.aws import client
        from spotrelay.adapters.dynamodb_job_store import DynamoDBJobStore
        from spotrelay.domain.models import job_id_for
        from spotrelay.settings import settings

        etag = client("s3").head_object(Bucket=settings().bucket, Key=key)["ETag"]
        return DynamoDBJobStore().find_job(job_id_for(key, etag))
