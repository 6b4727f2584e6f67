"""Agent configuration from tags, a file and the environment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.config import AgentConfig, load_config, with_instance_facts
from spotrelay.errors import AgentConfigError


def test_env_beats_file_beats_tags(tmp_path: Path) -> None:
    file = tmp_path / "agent.json"
    file.write_text(json.dumps({"job_id": "from-file", "attempt": 2, "rank": 1, "nodes": 4}))
    tags = {"spotrelay:job-id": "from-tags", "spotrelay:master-port": "29999", "Name": "x", "spotrelay:bogus": "1"}
    env = {"SPOTRELAY_AGENT_CONFIG": str(file), "SPOTRELAY_AGENT_RANK": "3", "SPOTRELAY_AGENT_HEARTBEAT_S": "2.5"}
    config = load_config(env=env, tags=tags)
    assert (config.job_id, config.attempt, config.rank, config.nodes) == ("from-file", 2, 3, 4)
    assert config.master_port == 29999 and config.heartbeat_s == 2.5
    assert config.node == "a2-r3"
    assert config.control == Path("/opt/spotrelay/run/control")


def test_tags_alone_are_enough() -> None:
    tags = {"spotrelay:job-id": "j", "spotrelay:attempt": "1", "spotrelay:rank": "0", "spotrelay:nodes": "2"}
    assert load_config(env={}, tags=tags).job_id == "j"
    # as the EC2 compute adapter tags instances: spotrelay:job, no node count (the spec has it)
    ec2 = {"spotrelay:job": "j2", "spotrelay:attempt": "3", "spotrelay:rank": "1", "spotrelay:config-uri": "s3://b/k"}
    config = load_config(env={}, tags=ec2)
    assert (config.job_id, config.attempt, config.rank, config.nodes, config.config_uri) == (
        "j2",
        3,
        1,
        None,
        "s3://b/k",
    )


def test_missing_fields_are_named() -> None:
    with pytest.raises(AgentConfigError, match="job_id"):
        load_config(env={"SPOTRELAY_AGENT_RANK": "0"})
    with pytest.raises(AgentConfigError, match="rank"):
        load_config(env={"SPOTRELAY_AGENT_JOB_ID": "j", "SPOTRELAY_AGENT_ATTEMPT": "1", "SPOTRELAY_AGENT_RANK": "-1"})


def test_instance_facts_fill_only_gaps() -> None:
    config = AgentConfig(job_id="j", attempt=1, rank=0, nodes=1, private_ip="127.0.0.1")
    filled = with_instance_facts(config, {"private_ip": "10.0.0.9", "instance_id": "i-1", "az": None})
    assert filled.private_ip == "127.0.0.1" and filled.instance_id == "i-1" and filled.az is None


def test_json_user_data_between_tags_and_file(tmp_path: Path) -> None:
    user_data = json.dumps({"spotrelay_agent": {"job_id": "from-ud", "attempt": 1, "rank": 0, "master_port": 29411}})
    tags = {"spotrelay:job": "from-tags", "spotrelay:master-port": "29999"}
    config = load_config(env={}, tags=tags, user_data=user_data)
    assert (config.job_id, config.master_port) == ("from-ud", 29411)
    file = tmp_path / "agent.json"
    file.write_text(json.dumps({"job_id": "from-file"}))
    assert load_config(env={}, file=file, tags=tags, user_data=user_data).job_id == "from-file"
    # a bootstrap script is not config
    assert (
        load_config(
            env={}, tags={**tags, "spotrelay:attempt": "1", "spotrelay:rank": "0"}, user_data="#!/bin/bash\necho hi"
        ).job_id
        == "from-tags"
    )
