"""The twin's Step Functions take a task token completed during its own Lambda invocation.

register_wait settles at once when the nodes reported before the wait was registered (a fast
trainer, a loaded machine): its SendTaskSuccess then arrives while the waitForTaskToken task is
still invoking. Step Functions takes it; moto lost it on tasks with HeartbeatSeconds and ended the
task in a heartbeat timeout (the outcome wait then read as a lost gang: a flaky
test_user_error_follows_the_restart_policy). spotrelay/local/lambda_seam.py closes that gap.
"""

from __future__ import annotations

import json
from typing import Any

from spotrelay.adapters.aws import client
from spotrelay.local import lambda_seam, workflow_setup
from tests.integration.controller_doubles import wait_until

FUNCTION = "spotrelay-test-early-callback"


def _complete_own_token(event: dict[str, Any], context: Any) -> dict[str, Any]:
    client("stepfunctions").send_task_success(taskToken=event["token"], output=json.dumps({"early": True}))
    return {}


def _machine(role: str, function_arn: str, heartbeat: bool) -> dict[str, Any]:
    task: dict[str, Any] = {
        "Type": "Task", "Resource": "arn:aws:states:::lambda:invoke.waitForTaskToken",
        "Parameters": {"FunctionName": function_arn, "Payload": {"token.$": "$$.Task.Token"}},
        "TimeoutSeconds": 300, "End": True,
    }
    if heartbeat:
        task["HeartbeatSeconds"] = 2  # without the seam's fix the task fails after these 2 s
    return {"StartAt": "Wait", "States": {"Wait": task}}


def _run(heartbeat: bool) -> dict[str, Any]:
    role = workflow_setup._role_arn()
    lambda_seam.register(FUNCTION, _complete_own_token)
    arn = client("lambda").create_function(
        FunctionName=FUNCTION, Runtime="python3.11", Role=role, Handler="handler.handler",
        Code={"ZipFile": workflow_setup._zip()}, Timeout=60)["FunctionArn"]
    sfn = client("stepfunctions")
    machine = sfn.create_state_machine(name=f"early-{heartbeat}", roleArn=role,
                                       definition=json.dumps(_machine(role, arn, heartbeat)))
    execution = sfn.start_execution(stateMachineArn=machine["stateMachineArn"])["executionArn"]
    return dict(wait_until(lambda: (d := sfn.describe_execution(executionArn=execution))["status"] != "RUNNING"
                           and d, what="the execution ends"))


def test_a_token_completed_during_its_invocation_ends_the_heartbeat_task(aws: dict[str, str]) -> None:
    done = _run(heartbeat=True)
    assert done["status"] == "SUCCEEDED", done
    assert json.loads(done["output"]) == {"early": True}


def test_a_token_completed_during_its_invocation_ends_the_plain_task(aws: dict[str, str]) -> None:
    done = _run(heartbeat=False)
    assert done["status"] == "SUCCEEDED", done
    assert json.loads(done["output"]) == {"early": True}
