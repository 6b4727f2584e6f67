"""What the agent is told: its job, attempt, rank and where things are.

Sources, later ones win:

1. instance tags read through IMDS (``spotrelay:job-id``, ``spotrelay:rank`` ...: the field name
   with ``-`` for ``_``), so a node launched from a tagged fleet knows who it is;
2. user data that is JSON, ``{"spotrelay_agent": {...fields}}`` (read through IMDS);
3. a JSON file (``--config`` or ``SPOTRELAY_AGENT_CONFIG``); the user-data template writes it to
   ``/etc/spotrelay/agent.json``;
4. the environment, ``SPOTRELAY_AGENT_<FIELD>`` (tests and the local twin).

What the node can find out itself (instance id, region, AZ, private IP, instance type) comes from
IMDS when it is not given.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from spotrelay.contracts.agent import AgentPort, JobView, node_id_for
from spotrelay.errors import AgentConfigError, validation_message
from spotrelay.spec.load import load_spec, parse_spec
from spotrelay.spec.models import JobSpec

ENV_PREFIX = "SPOTRELAY_AGENT_"
ENV_CONFIG_FILE = "SPOTRELAY_AGENT_CONFIG"
TAG_PREFIX = "spotrelay:"
USER_DATA_KEY = "spotrelay_agent"
TAG_ALIASES = {"job": "job_id"}  # the EC2 compute adapter tags spotrelay:job


class AgentConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # who we are
    job_id: str = Field(..., min_length=1)
    attempt: int = Field(..., ge=1)
    rank: int = Field(..., ge=0, description="node rank within the job (0 hosts the rendezvous)")
    nodes: int | None = Field(None, ge=1, description="nodes in this attempt; default: the spec's")
    node_id: str | None = Field(None, description="default a<attempt>-r<rank>")
    nproc_per_node: int | None = Field(None, ge=1, description="default: the spec's gpus_per_node, or 1")
    config_uri: str | None = Field(None, description="job spec: s3://..., a path; default: the job record")
    # where we are (IMDS fills what is missing)
    instance_id: str | None = None
    region: str | None = None
    az: str | None = None
    private_ip: str | None = None
    instance_type: str | None = None
    # AWS names for the port's adapter (default: the deployment's, from its environment)
    jobs_table: str | None = None
    nodes_table: str | None = None
    event_bus: str | None = None
    log_group: str | None = Field(None, description="CloudWatch Logs group for the training output (None: local)")
    imds_endpoint: str = "http://169.254.169.254"
    # local paths
    work_dir: Path = Path("/opt/spotrelay/run")
    control_dir: Path | None = Field(None, description="default <work_dir>/control")
    checkpoint_dir: Path | None = Field(None, description="fast tier; default: the spec's local_dir/<job>")
    checkpoint_uri: str | None = Field(None, description="durable tier; default: the spec's, else <durable_root><job>")
    durable_root: str | None = Field(None, description="s3://<bucket>/checkpoints/; default: the port's")
    python: str | None = Field(None, description="interpreter for the launcher; default: the agent's")
    fsx_source: str | None = Field(None, description="the region's FSx for Lustre, <dns>@tcp:/<mount name> "
                                   "(the spotrelay:fsx-source tag); mounted when the spec's dataset.fsx asks")
    # rendezvous and timing
    master_port: int = Field(29500, ge=1, le=65535)
    imds_poll_s: float = Field(2.0, gt=0, description="IMDS notices are checked this often")
    directive_poll_s: float = Field(5.0, gt=0)
    heartbeat_s: float = Field(30.0, gt=0)
    rank0_wait_s: float = Field(900.0, gt=0, description="give up waiting for rank 0's address")
    stop_grace_s: float = Field(30.0, gt=0, description="after a deadline, wait this long before killing")
    linger_s: float = Field(600.0, ge=0, description="a surviving node waits this long to join the next gang")
    track_end_s: float = Field(20.0, ge=0, description="rank 0 waits at most this long for MLflow to record "
                               "the attempt's end before it reports the exit")
    imds_failures_anomaly: int = Field(3, ge=1, description="consecutive failed polls before an Anomaly")

    @property
    def node(self) -> str:
        return self.node_id or node_id_for(self.attempt, self.rank)

    @property
    def control(self) -> Path:
        return self.control_dir or self.work_dir / "control"


def from_tags(tags: Mapping[str, str]) -> dict[str, Any]:
    fields = AgentConfig.model_fields
    out: dict[str, Any] = {}
    for key, value in tags.items():
        if key.startswith(TAG_PREFIX):
            name = key[len(TAG_PREFIX) :].replace("-", "_")
            name = TAG_ALIASES.get(name, name)
            if name in fields:
                out[name] = value
    return out


def from_env(env: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in AgentConfig.model_fields:
        value = env.get(ENV_PREFIX + name.upper())
        if value:
            out[name] = value
    return out


def from_file(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise AgentConfigError(f"cannot read agent config {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise AgentConfigError(f"agent config {path} must be a JSON object")
    return data


def from_user_data(text: str | None) -> dict[str, Any]:
    """Agent fields from user data that is a JSON object with a ``spotrelay_agent`` member; a
    bootstrap script (agent/userdata.py) or anything else gives nothing (it writes the file)."""
    try:
        data = json.loads(text or "")
    except ValueError:
        return {}
    section = data.get(USER_DATA_KEY) if isinstance(data, dict) else None
    return dict(section) if isinstance(section, dict) else {}


def load_config(
    env: Mapping[str, str] | None = None,
    file: Path | None = None,
    tags: Mapping[str, str] | None = None,
    user_data: str | None = None,
) -> AgentConfig:
    """Merge tags < user data < file < environment; ``AgentConfigError`` naming what is wrong."""
    env = os.environ if env is None else env
    merged: dict[str, Any] = from_tags(tags or {})
    merged.update(from_user_data(user_data))
    path = file or (Path(env[ENV_CONFIG_FILE]) if env.get(ENV_CONFIG_FILE) else None)
    if path is not None:
        merged.update(from_file(path))
    merged.update(from_env(env))
    try:
        return AgentConfig.model_validate(merged)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {validation_message(e)}" for e in exc.errors())
        raise AgentConfigError(f"agent config: {problems}") from exc


def with_instance_facts(config: AgentConfig, facts: Mapping[str, str | None]) -> AgentConfig:
    """Fill instance_id/region/az/private_ip/instance_type that were not given (from IMDS)."""
    missing = {k: v for k, v in facts.items() if v and getattr(config, k) is None}
    return config.model_copy(update=missing) if missing else config


def load_job_and_spec(config: AgentConfig, port: AgentPort) -> tuple[JobView, JobSpec]:
    """The job record (as the port shows it) and its spec: from ``config_uri`` (s3:// or a path) or
    the job record."""
    job = port.job()
    if job is None:
        raise AgentConfigError(f"job {config.job_id} not found")
    uri = config.config_uri
    if uri is None:
        if not job.spec:
            raise AgentConfigError(f"job {config.job_id} has no spec and no config_uri was given")
        return job, JobSpec.model_validate(job.spec)
    if uri.startswith("s3://"):
        from spotrelay.adapters.aws import client

        bucket, _, key = uri.removeprefix("s3://").partition("/")
        text = client("s3").get_object(Bucket=bucket, Key=key)["Body"].read()
        return job, parse_spec(text, uri)
    return job, load_spec(uri.removeprefix("file://"))
