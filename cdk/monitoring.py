"""Alarms (failed executions, DLQ depth, handler errors, training anomalies, recovery storms) to the
notifications topic, and a dashboard with the controller's own metrics (spotrelay/ports/metrics.py,
published by the handlers as EMF log lines: no PutMetricData permission)."""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from cdk.config import AppConfig
from spotrelay.ports.metrics import NAMESPACE, SERVICE

PERIOD = Duration.minutes(5)
RECOVERY_STORM = 5  # recoveries in an hour: the market is churning or a job is crash-looping


def controller_metric(name: str, statistic: str = "Sum", period: Duration = PERIOD) -> cw.Metric:
    return cw.Metric(namespace=NAMESPACE, metric_name=name, dimensions_map={"service": SERVICE},
                     statistic=statistic, period=period)


class Monitoring(Construct):
    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        config: AppConfig,
        topic: sns.ITopic,
        state_machine: sfn.StateMachine,
        functions: dict[str, lambda_.Function],
        dlqs: dict[str, sqs.Queue],
    ) -> None:
        super().__init__(scope, id)
        action = cw_actions.SnsAction(topic)
        self.alarms: list[cw.Alarm] = []

        def alarm(alarm_id: str, metric: cw.IMetric, description: str, threshold: float = 1) -> cw.Alarm:
            created = cw.Alarm(
                self,
                alarm_id,
                metric=metric,
                threshold=threshold,
                evaluation_periods=1,
                comparison_operator=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
                treat_missing_data=cw.TreatMissingData.NOT_BREACHING,
                alarm_name=f"{config.prefix}-{alarm_id}",
                alarm_description=description,
            )
            created.add_alarm_action(action)
            self.alarms.append(created)
            return created

        alarm(
            "ExecutionsFailed",
            state_machine.metric_failed(period=PERIOD, statistic="Sum"),
            "a job-run execution failed (the job's FAILED record says why)",
        )
        alarm(
            "ExecutionsTimedOut",
            state_machine.metric_timed_out(period=PERIOD, statistic="Sum"),
            "a job-run execution timed out",
        )
        alarm(
            "TrainingAnomalies",
            controller_metric("TrainingAnomalies"),
            "a training run reported a health anomaly (NaN, loss spike, straggler, hang); `spotrelay describe JOB`",
        )
        alarm(
            "ReconcileJobErrors",
            controller_metric("ReconcileJobErrors"),
            "the reconcile sweep could not handle a job (the others were swept); its log names the job and step",
        )
        alarm(
            "RecoveryStorm",
            controller_metric("Recoveries", period=Duration.hours(1)),
            f"{RECOVERY_STORM} or more recoveries in an hour across jobs: check the pools' cooldowns and the jobs",
            threshold=RECOVERY_STORM,
        )
        for logical, queue in sorted(dlqs.items()):
            alarm(
                f"{logical}DlqDepth",
                queue.metric_approximate_number_of_messages_visible(period=PERIOD, statistic="Maximum"),
                f"events for rule {logical} could not be delivered; inspect and redrive the DLQ",
            )
        for module, fn in sorted(functions.items()):
            alarm(
                f"{''.join(p.title() for p in module.split('_'))}Errors",
                fn.metric_errors(period=PERIOD, statistic="Sum"),
                f"{module} raised; see /aws/lambda/{fn.function_name}",
            )

        self.dashboard = cw.Dashboard(self, "Dashboard", dashboard_name=config.resource_name("controller"))
        self.dashboard.add_widgets(
            cw.GraphWidget(
                title="job-run executions",
                width=12,
                left=[
                    state_machine.metric_started(period=PERIOD, statistic="Sum"),
                    state_machine.metric_succeeded(period=PERIOD, statistic="Sum"),
                    state_machine.metric_failed(period=PERIOD, statistic="Sum"),
                    state_machine.metric_timed_out(period=PERIOD, statistic="Sum"),
                ],
            ),
            cw.GraphWidget(
                title="dead-letter queues",
                width=12,
                left=[
                    q.metric_approximate_number_of_messages_visible(period=PERIOD, label=name)
                    for name, q in sorted(dlqs.items())
                ],
            ),
        )
        self.dashboard.add_widgets(
            cw.GraphWidget(
                title="handler errors",
                width=8,
                left=[fn.metric_errors(period=PERIOD, statistic="Sum", label=m) for m, fn in sorted(functions.items())],
            ),
            cw.GraphWidget(
                title="handler p99 duration",
                width=8,
                left=[
                    fn.metric_duration(period=PERIOD, statistic="p99", label=m) for m, fn in sorted(functions.items())
                ],
            ),
            cw.GraphWidget(
                title="handler throttles",
                width=8,
                left=[
                    fn.metric_throttles(period=PERIOD, statistic="Sum", label=m) for m, fn in sorted(functions.items())
                ],
            ),
            cw.AlarmStatusWidget(title="alarms", width=24, alarms=self.alarms),
        )
        self.dashboard.add_widgets(
            cw.GraphWidget(
                title="spot notices, recoveries, anomalies",
                width=8,
                left=[controller_metric(n) for n in ("SpotNotices", "Recoveries", "TrainingAnomalies",
                                                      "ReconcileJobErrors")],
            ),
            cw.GraphWidget(
                title="steps lost and downtime",
                width=8,
                left=[controller_metric("StepsLost")],
                right=[controller_metric("DowntimeSeconds", "Maximum")],
            ),
            cw.GraphWidget(
                title="checkpoint flush (p90, max) and job cost",
                width=8,
                left=[controller_metric("CheckpointFlushSeconds", "p90"),
                      controller_metric("CheckpointFlushSeconds", "Maximum")],
                right=[controller_metric("JobCostUSD")],
            ),
        )
