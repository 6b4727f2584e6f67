"""Metrics as CloudWatch embedded metric format lines (Powertools ``single_metric``).

Each value is flushed at once as one EMF line on stdout, which Lambda sends to CloudWatch Logs,
where CloudWatch extracts the metric: no PutMetricData call, no extra permission, and nothing to
flush at the end of a handler. Powertools' metrics module is imported on the first value only,
so a handler that publishes nothing does not pay for it at cold start.
"""

from __future__ import annotations

from spotrelay.ports.metrics import NAMESPACE, SERVICE


class EmfMetrics:
    def __init__(self, namespace: str = NAMESPACE, service: str = SERVICE) -> None:
        self.namespace, self.service = namespace, service

    def put(self, name: str, value: float, unit: str = "Count") -> None:
        from aws_lambda_powertools.metrics import MetricUnit, single_metric

        with single_metric(name=name, unit=MetricUnit(unit), value=float(value), namespace=self.namespace) as metric:
            metric.add_dimension(name="service", value=self.service)
