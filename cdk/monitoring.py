"""Alarms (failed executions, DLQ depth, handler errors) to the notifications topic, and a dashboard."""

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

PERIOD = Duration.minutes(5)


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

        def alarm(alarm_id: str, metric: cw.IMetric, description: str) -> cw.Alarm:
            created = cw.Alarm(
                self,
                alarm_id,
                metric=metric,
                threshold=1,
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
