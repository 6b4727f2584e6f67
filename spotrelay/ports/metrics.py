"""Operator metrics from the controller (CloudWatch, through Powertools' embedded metric format)."""

from __future__ import annotations

from typing import Protocol

NAMESPACE = "Spotrelay"
SERVICE = "spotrelay"  # the one dimension: per-job values would make one metric per job

# name -> unit; the dashboard and alarms (cdk/monitoring.py) read the same names
METRICS = {
    "SpotNotices": "Count",
    "Recoveries": "Count",
    "StepsLost": "Count",
    "DowntimeSeconds": "Seconds",
    "CheckpointFlushSeconds": "Seconds",
    "JobCostUSD": "None",
    "TrainingAnomalies": "Count",
    "ReconcileJobErrors": "Count",  # a job's step of the reconcile sweep failed (the others went on)
}


class MetricsSink(Protocol):
    def put(self, name: str, value: float, unit: str = "Count") -> None: ...
