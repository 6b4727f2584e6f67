"""The user-data bootstrap: valid bash, the agent config and environment, the systemd unit."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
from pydantic import ValidationError

from agent.config import load_config
from agent.userdata import UserDataParams, render_user_data


def _render() -> str:
    return render_user_data(
        UserDataParams(
            home_region="us-east-1",
            wheel_uri="s3://jobs/artifacts/agent/spotrelay-0.1.0-py3-none-any.whl",
            env={"SPOTRELAY_NODES_TABLE": "prod-nodes", "SPOTRELAY_EVENT_BUS": "default"},
            agent={"config_uri": "s3://jobs/submissions/llm.yaml", "master_port": 29400},
        )
    )


def test_renders_valid_bash_with_agent_config(tmp_path: object) -> None:
    text = _render()
    assert text.startswith("#!/bin/bash\n")
    subprocess.run(["bash", "-n"], input=text.encode(), check=True)  # syntax only
    agent_json = re.search(r"agent.json <<'JSON'\n(.*?)\nJSON\n", text, re.S)
    assert agent_json is not None
    config = json.loads(agent_json.group(1))
    assert config["config_uri"] == "s3://jobs/submissions/llm.yaml" and config["master_port"] == 29400
    # with the tags EC2 puts on the instance, that is a complete agent config
    tags = {"spotrelay:job": "llm-1", "spotrelay:attempt": "2", "spotrelay:rank": "5"}
    full = load_config(env={}, tags={**tags, **{f"spotrelay:{k}": str(v) for k, v in config.items()}})
    assert (full.job_id, full.rank, full.master_port) == ("llm-1", 5, 29400)
    assert "AWS_REGION=us-east-1" in text and "SPOTRELAY_NODES_TABLE=prod-nodes" in text


def test_systemd_unit() -> None:
    text = _render()
    unit = text[text.index("[Unit]") : text.index("UNIT\n\nsystemctl")]
    assert "ExecStart=$PYTHON_ENV/bin/spotrelay-agent --config /etc/spotrelay/agent.json" in unit
    for line in ("KillMode=mixed", "Restart=no", "LimitMEMLOCK=infinity", "WantedBy=multi-user.target"):
        assert line in unit
    assert "systemctl enable --now spotrelay-agent.service" in text
    assert 'pip" install --quiet --no-deps' in text  # never replace the AMI's CUDA build of torch


def test_unknown_agent_fields_refused() -> None:
    with pytest.raises(ValidationError, match="unknown agent config fields"):
        UserDataParams(home_region="us-east-1", agent={"jobid": "x"})
