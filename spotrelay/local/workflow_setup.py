"""Build the job-run workflow in moto from the same ASL file that CDK deploys.

Every ``${fn_<module>}`` placeholder becomes a moto Lambda function named
``lambda_seam.function_name_for(module)`` whose invocations the seam serves with
``functions.<module>.handler`` in this process. Shared by the tests and the local twin.
"""

from __future__ import annotations

import io
import json
import re
import zipfile
from pathlib import Path
from typing import Any

from spotrelay.adapters.aws import client
from spotrelay.local import lambda_seam
from spotrelay.resources import RESOURCES

ASL_PATH = Path(__file__).resolve().parents[2] / "functions" / "workflows" / "job_run.asl.json"
_PLACEHOLDER = re.compile(r"\$\{(fn_[a-z0-9_]+)\}")
_ROLE = "spotrelay-local-lambda"


def asl_text(path: Path = ASL_PATH) -> str:
    return path.read_text()


def lambda_modules(text: str | None = None) -> list[str]:
    """The handler modules the ASL invokes (``fn_sfn_plan`` -> ``sfn_plan``)."""
    return sorted({name[3:] for name in _PLACEHOLDER.findall(text or asl_text())})


def render(text: str, substitutions: dict[str, str]) -> str:
    """Replace ``${name}`` placeholders; refuse to leave one unresolved."""
    out = re.sub(r"\$\{([A-Za-z0-9_]+)\}", lambda m: substitutions.get(m.group(1), m.group(0)), text)
    missing = re.findall(r"\$\{([A-Za-z0-9_]+)\}", out)
    if missing:
        raise ValueError(f"unresolved ASL placeholders: {sorted(set(missing))}")
    json.loads(out)  # still valid JSON
    return out


def _zip() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("handler.py", "def handler(event, context):\n    return event\n")
    return buf.getvalue()


def _role_arn() -> str:
    iam = client("iam")
    trust = {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": {"Service": ["lambda.amazonaws.com", "states.amazonaws.com"]},
         "Action": "sts:AssumeRole"}]}
    try:
        return str(iam.get_role(RoleName=_ROLE)["Role"]["Arn"])
    except iam.exceptions.NoSuchEntityException:
        return str(iam.create_role(RoleName=_ROLE, AssumeRolePolicyDocument=json.dumps(trust))["Role"]["Arn"])


def ensure_function(module: str, role_arn: str) -> str:
    """Register ``functions.<module>.handler`` with the seam and make sure moto has the function."""
    name = lambda_seam.register_module(module)
    lam = client("lambda")
    try:
        return str(lam.get_function(FunctionName=name)["Configuration"]["FunctionArn"])
    except lam.exceptions.ResourceNotFoundException:
        created = lam.create_function(
            FunctionName=name, Runtime="python3.11", Role=role_arn, Handler="handler.handler",
            Code={"ZipFile": _zip()}, Timeout=60,
        )
        return str(created["FunctionArn"])


def create_workflow(name: str | None = None, extra: dict[str, str] | None = None) -> str:
    """Create (or update) the job-run state machine in moto; return its ARN.

    Call after ``motoserver.start()``; set ``SPOTRELAY_STATE_MACHINE_ARN`` to the result so the
    workflow adapter finds it.
    """
    lambda_seam.install()
    text = asl_text()
    role = _role_arn()
    subs = {f"fn_{module}": ensure_function(module, role) for module in lambda_modules(text)}
    subs.update(extra or {})
    definition = render(text, subs)
    sfn = client("stepfunctions")
    sm_name = name or RESOURCES.state_machine_default
    for machine in sfn.list_state_machines().get("stateMachines", []):
        if machine["name"] == sm_name:
            sfn.update_state_machine(stateMachineArn=machine["stateMachineArn"], definition=definition)
            return str(machine["stateMachineArn"])
    created: dict[str, Any] = sfn.create_state_machine(name=sm_name, definition=definition, roleArn=role)
    return str(created["stateMachineArn"])
