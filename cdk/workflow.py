"""The job-run state machine, loaded from the ASL file the local twin also runs.

Placeholders: ``${fn_<module>}`` is the ARN of ``functions/<module>.py``'s Lambda, ``${TopicArn}`` the
notifications topic, and any name in ``extra``. Every placeholder in the file must have a value, or
synth stops naming the missing ones.
"""

from __future__ import annotations

import re
from pathlib import Path

from aws_cdk import RemovalPolicy
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from cdk.config import AppConfig, InfraConfigError

ROOT = Path(__file__).resolve().parent.parent
ASL_PATH = ROOT / "functions" / "workflows" / "job_run.asl.json"
PLACEHOLDER = re.compile(r"\$\{([A-Za-z0-9_]+)\}")


def placeholders(text: str) -> list[str]:
    return sorted(set(PLACEHOLDER.findall(text)))


def substitutions(asl_text: str, functions: dict[str, lambda_.IFunction], extra: dict[str, str]) -> dict[str, str]:
    """Values for every placeholder in ``asl_text``; raise naming the ones without a value."""
    values: dict[str, str] = {}
    missing = []
    for name in placeholders(asl_text):
        if name.startswith("fn_") and name[3:] in functions:
            values[name] = functions[name[3:]].function_arn
        elif name in extra:
            values[name] = extra[name]
        else:
            missing.append(name)
    if missing:
        known = sorted([f"fn_{m}" for m in functions] + list(extra))
        raise InfraConfigError(
            f"{ASL_PATH.name}: no value for placeholder(s) {', '.join('${' + m + '}' for m in missing)}; "
            f"known: {', '.join(known)} (fn_<module> needs functions/<module>.py with a handler)"
        )
    return values


def render(asl_text: str, values: dict[str, str]) -> str:
    """The definition after substitution (what Step Functions runs; tests compare against it)."""
    return PLACEHOLDER.sub(lambda m: values[m.group(1)], asl_text)


class Workflow(Construct):
    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        config: AppConfig,
        name: str,
        functions: dict[str, lambda_.IFunction],
        extra: dict[str, str],
        asl_path: Path = ASL_PATH,
    ) -> None:
        super().__init__(scope, id)
        if not asl_path.is_file():
            raise InfraConfigError(f"state machine definition not found: {asl_path}")
        text = asl_path.read_text()
        self.asl_path = asl_path
        self.substitutions = substitutions(text, functions, extra)
        self.log_group = logs.LogGroup(
            self,
            "Logs",
            log_group_name=f"/aws/vendedlogs/states/{name}",
            removal_policy=RemovalPolicy.DESTROY,
        )
        self.log_group.node.default_child.retention_in_days = config.log_retention_days  # type: ignore[union-attr]
        self.state_machine = sfn.StateMachine(
            self,
            "JobRun",
            state_machine_name=name,
            state_machine_type=sfn.StateMachineType.STANDARD,
            definition_body=sfn.DefinitionBody.from_file(str(asl_path)),
            definition_substitutions=self.substitutions,
            tracing_enabled=True,
            logs=sfn.LogOptions(destination=self.log_group, level=sfn.LogLevel.ALL, include_execution_data=True),
        )
        # Only the functions the definition names may be invoked.
        used = {n[3:] for n in self.substitutions if n.startswith("fn_")}
        for module in sorted(used):
            functions[module].grant_invoke(self.state_machine)
