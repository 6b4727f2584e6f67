"""``spotrelay-agent``: the daemon on each training node (the loop is agent/daemon.py).

Configure (file, environment, tags and user data through IMDS), then run this node's part of the
job and exit with the node's code (spotrelay.contracts.exit_codes). See docs/agent.md.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path

from agent import reporting
from agent.code import prepare as prepare_code
from agent.config import AgentConfig, from_env, load_config, load_job_and_spec, with_instance_facts
from agent.daemon import Agent
from agent.fsx import FsxMountError, mount_dataset
from agent.imds import DEFAULT_ENDPOINT, ImdsClient
from agent.log_shipper import LogSink
from agent.reporting import Reporter, warn
from spotrelay.contracts.agent import AgentPort
from spotrelay.contracts.exit_codes import ExitCode
from spotrelay.errors import AgentConfigError, ImdsUnavailableError
from spotrelay.ports.logs import LOG_GROUP_ENV


def agent_port(config: AgentConfig) -> AgentPort:
    """The agent's only channel to the controller: events on the home bus, reads of its job's items
    (in AWS_REGION, the home region)."""
    from spotrelay.adapters.aws_agent_port import AwsAgentPort

    return AwsAgentPort(config.job_id, config.jobs_table, config.nodes_table, config.event_bus)


def log_sink(config: AgentConfig) -> LogSink | None:
    """CloudWatch Logs for the training output, when the stacks gave a group (none in the twin)."""
    group = config.log_group or os.environ.get(LOG_GROUP_ENV)
    if not group:
        return None
    from spotrelay.adapters.cloudwatch_logs import CloudWatchTrainingLogs

    return CloudWatchTrainingLogs(group)  # in AWS_REGION, the home region, like the bus and tables


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="spotrelay-agent", description=__doc__)
    parser.add_argument("--config", type=Path, help="agent config JSON (default $SPOTRELAY_AGENT_CONFIG)")
    args = parser.parse_args(argv)
    sys.exit(run_agent(args.config))


def configure(config_file: Path | None) -> tuple[AgentConfig, ImdsClient]:
    """The config from file/env, completed from instance tags and facts read through IMDS."""
    try:
        config: AgentConfig | None = load_config(file=config_file)
    except AgentConfigError:
        config = None  # maybe the tags say who we are: ask IMDS
    endpoint = config.imds_endpoint if config else from_env(os.environ).get("imds_endpoint", DEFAULT_ENDPOINT)
    imds = ImdsClient(endpoint)
    try:
        if config is None:
            config = load_config(file=config_file, tags=imds.tags(), user_data=imds.user_data())
        config = with_instance_facts(
            config,
            {
                "instance_id": imds.instance_id(),
                "region": imds.region(),
                "az": imds.availability_zone(),
                "private_ip": imds.private_ip(),
                "instance_type": imds.instance_type(),
            },
        )
    except ImdsUnavailableError as exc:
        if config is None:
            raise AgentConfigError(f"no complete agent config, and IMDS (for tags) is unavailable: {exc}") from exc
        warn("IMDS unavailable at start; using configured facts", error=str(exc))
    return config, imds


def run_agent(config_file: Path | None = None) -> int:
    if os.environ.get("SPOTRELAY_HOME_REGION") and not os.environ.get("AWS_REGION"):
        os.environ["AWS_REGION"] = os.environ["SPOTRELAY_HOME_REGION"]  # tables and bus live there
    try:
        config, imds = configure(config_file)
    except AgentConfigError as exc:  # nobody to report to: say it on stderr, where systemd keeps it
        print(json.dumps({"level": "ERROR", "msg": "agent not configured", "error": str(exc)}), file=sys.stderr)
        return ExitCode.INFRA_ERROR
    reporting.setup_logging(config.job_id, config.node)
    port = agent_port(config)
    reporter = Reporter(config, port)
    agent = Agent(config, port, reporter, imds, log_sink=log_sink(config))
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, agent.on_signal)
    try:
        job, spec = load_job_and_spec(config, port)
        try:
            mount_dataset(spec, config.fsx_source)  # dataset.fsx, before any rank reads it
        except FsxMountError as exc:
            reporter.training_exited(ExitCode.INFRA_ERROR, f"infra-error: {exc}", None, None, str(exc))
            return int(ExitCode.INFRA_ERROR)
        refused = prepare_code(agent, spec, config.work_dir, reporter)  # entrypoint.code, before any rank
        if refused is not None:
            return refused
        return agent.serve(job, spec, track=True)
    except Exception as exc:  # the agent's own failure is infrastructure, never the user's code
        reporting.log.exception("agent failed")
        reporter.anomaly("agent-failed", f"{type(exc).__name__}: {exc}")
        reporter.training_exited(ExitCode.INFRA_ERROR, f"infra-error: {type(exc).__name__}: {exc}", None, None)
        return ExitCode.INFRA_ERROR


if __name__ == "__main__":
    main()
