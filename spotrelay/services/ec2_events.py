"""Pydantic models of the EC2 events the controller handles (EventBridge envelopes, real field names)."""

from __future__ import annotations

from typing import Literal

from aws_lambda_powertools.utilities.parser.models import EventBridgeModel
from pydantic import BaseModel, ConfigDict, Field


class SpotInterruptionDetail(BaseModel):
    model_config = ConfigDict(populate_by_name=True)
    instance_id: str = Field(..., alias="instance-id", pattern=r"^i-[0-9a-f]+$")
    instance_action: str = Field(..., alias="instance-action")  # terminate | stop | hibernate


class RebalanceDetail(BaseModel):
    model_config = ConfigDict(populate_by_name=True)
    instance_id: str = Field(..., alias="instance-id", pattern=r"^i-[0-9a-f]+$")


class InstanceStateDetail(BaseModel):
    model_config = ConfigDict(populate_by_name=True)
    instance_id: str = Field(..., alias="instance-id", pattern=r"^i-[0-9a-f]+$")
    state: Literal["pending", "running", "stopping", "stopped", "shutting-down", "terminated"]


class SpotInterruptionEvent(EventBridgeModel):
    detail: SpotInterruptionDetail
    detail_type: Literal["EC2 Spot Instance Interruption Warning"] = Field(..., alias="detail-type")


class RebalanceEvent(EventBridgeModel):
    detail: RebalanceDetail
    detail_type: Literal["EC2 Instance Rebalance Recommendation"] = Field(..., alias="detail-type")


class InstanceStateEvent(EventBridgeModel):
    detail: InstanceStateDetail
    detail_type: Literal["EC2 Instance State-change Notification"] = Field(..., alias="detail-type")
