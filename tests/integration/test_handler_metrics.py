"""Operator metrics from the handlers: what each event publishes (a recording sink in place of the
EMF adapter), and the EMF line the adapter writes (CloudWatch extracts the metric from the log)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from functions import on_agent_event, on_interruption_notice
from spotrelay.adapters.emf_metrics import EmfMetrics
from tests.integration.controller_doubles import Env, agent_event, ctx, ec2_event, env, replaced, running_job

__all__ = ["env"]


class Recorded:
    def __init__(self) -> None:
        self.values: list[tuple[str, float, str]] = []

    def put(self, name: str, value: float, unit: str = "Count") -> None:
        self.values.append((name, value, unit))


@pytest.fixture
def recorded(env: Env) -> Iterator[Recorded]:
    sink = Recorded()
    with replaced(metrics=lambda: sink):
        yield sink


def test_notice_checkpoint_and_anomaly_publish_their_metrics(env: Env, recorded: Recorded) -> None:
    job, gang = running_job(env.store, env.compute)
    on_agent_event.handler(agent_event("CheckpointCommitted", gang[0], step=50, duration_s=4.5), ctx())
    on_agent_event.handler(agent_event("CheckpointCommitted", gang[1], step=50, duration_s=4.7), ctx())  # same save
    health = {"kind": "loss-spike", "action": "notify", "step": 51, "detail": "z 12"}
    on_agent_event.handler(agent_event("Anomaly", gang[0], what="loss-spike", health=health), ctx())
    on_interruption_notice.handler(ec2_event("ec2_spot_interruption_warning.json", gang[1].instance_id), ctx())
    assert recorded.values == [("CheckpointFlushSeconds", 4.5, "Seconds"), ("TrainingAnomalies", 1, "Count"),
                               ("SpotNotices", 1, "Count")]
    assert env.store.get_job(job.job_id).anomalies[0].kind == "loss-spike"


def test_emf_line_names_the_metric_namespace_and_dimension(capsys: pytest.CaptureFixture[str]) -> None:
    EmfMetrics().put("DowntimeSeconds", 42.5, "Seconds")
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    [directive] = line["_aws"]["CloudWatchMetrics"]
    assert directive["Namespace"] == "Spotrelay" and directive["Dimensions"] == [["service"]]
    assert directive["Metrics"] == [{"Name": "DowntimeSeconds", "Unit": "Seconds"}]
    assert line["DowntimeSeconds"] in (42.5, [42.5]) and line["service"] == "spotrelay"
