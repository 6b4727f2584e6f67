"""The EC2 user data that installs and starts the agent as a systemd unit on a Deep Learning AMI.

    render_user_data(UserDataParams(home_region="us-east-1", wheel_uri="s3://b/artifacts/agent/x.whl",
                                    agent={"config_uri": "s3://b/submissions/job.yaml"}))

Job id, attempt and rank usually come from instance tags (one launch template serves every node);
anything in ``agent`` is written to /etc/spotrelay/agent.json (see agent/config.py for the fields).
"""

from __future__ import annotations

import json
import shlex
from importlib import resources
from string import Template
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from agent.config import AgentConfig

USER_DATA_LIMIT = 16 * 1024  # EC2 refuses larger user data (before base64)
# What the agent imports beside the AMI's torch (mirrors pyproject's base + agent extras, minus torch).
AGENT_REQUIREMENTS = (
    "pydantic>=2.7",
    "pyyaml>=6.0",
    "boto3>=1.34",
    "requests>=2.31",
    "numpy>=1.26",
    "safetensors>=0.4",
    "torchdata",
    "mlflow-skinny>=2.14",
)


class UserDataParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    home_region: str = Field(..., description="region of the controller's tables and event bus")
    wheel_uri: str = Field("", description="s3:// URI of the spotrelay wheel; empty: already on the AMI")
    python_env: str = Field("/opt/pytorch", description="the DLAMI's PyTorch environment")
    working_dir: str = Field("/opt/spotrelay/code", description="where the job's code is")
    env: dict[str, str] = Field(default_factory=dict, description="more environment for the agent")
    agent: dict[str, Any] = Field(default_factory=dict, description="agent config fields")

    @field_validator("agent")
    @classmethod
    def _known_fields(cls, agent: dict[str, Any]) -> dict[str, Any]:
        unknown = set(agent) - set(AgentConfig.model_fields)
        if unknown:
            raise ValueError(f"unknown agent config fields: {sorted(unknown)}")
        return agent


def _env_file(values: dict[str, str]) -> str:
    return "\n".join(f"{key}={shlex.quote(value)}" for key, value in sorted(values.items()))


def render_user_data(params: UserDataParams) -> str:
    template = Template((resources.files("agent") / "templates" / "user_data.sh.tmpl").read_text())
    agent = {"work_dir": "/opt/spotrelay/run", **params.agent}
    env = {"AWS_REGION": params.home_region, "AWS_DEFAULT_REGION": params.home_region, **params.env}
    text = template.substitute(
        python_env=shlex.quote(params.python_env),
        wheel_uri=shlex.quote(params.wheel_uri),
        working_dir=params.working_dir,
        agent_json=json.dumps(agent, indent=2, default=str),
        agent_env=_env_file(env),
        agent_requirements=" ".join(shlex.quote(r) for r in AGENT_REQUIREMENTS),
    )
    if len(text.encode()) > USER_DATA_LIMIT:
        raise ValueError(f"user data is {len(text.encode())} bytes; EC2 allows {USER_DATA_LIMIT}")
    return text
