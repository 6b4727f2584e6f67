"""Least privilege per function: each handler's role holds exactly the actions its code can call.

The calls come from reading the code (tests/infrastructure/aws_calls.py), the grants from the synthesized
template. A difference fails with a message that names the action, the handler, the call chain that needs
it and the line of cdk/permissions.py to change.
"""

from __future__ import annotations

import ast
from typing import Any

import pytest

from cdk import staging
from cdk.permissions import ACTIONS, PLATFORM
from tests.infrastructure import aws_calls
from tests.infrastructure.conftest import Synth

# Only the launching workflow task may start instances or mint roles; event handlers may, when their
# code does (a replacement launched in the notice window), but no other sfn_* task ever.
LAUNCHER = "sfn_provision"
CREATES = frozenset({"ec2:CreateFleet", "ec2:RunInstances", "iam:CreateRole", "iam:CreateInstanceProfile",
                     "iam:PassRole", "iam:PutRolePolicy"})


@pytest.fixture(scope="module")
def calls() -> dict[str, dict[str, aws_calls.Call]]:
    return aws_calls.handler_calls(staging.discover_handlers())


def _differences(handler: str, needed: dict[str, aws_calls.Call], held: set[str], where: str) -> list[str]:
    out = [
        f"{handler}: its code calls {action} ({needed[action].chain()}) but {where} lacks it: add "
        f'"{action}" to ACTIONS["{handler}"] in cdk/permissions.py (and a scope in _SCOPES for a new kind of action)'
        for action in sorted(set(needed) - held)
    ]
    out += [
        f"{handler}: {where} holds {action}, which nothing in its code path calls: remove it from "
        f'ACTIONS["{handler}"] in cdk/permissions.py'
        for action in sorted(held - set(needed))
    ]
    return out


def test_declared_actions_are_exactly_what_each_handler_calls(calls: dict[str, dict[str, aws_calls.Call]]) -> None:
    problems = [f"ACTIONS in cdk/permissions.py lists {h}, which is not a handler: remove it"
                for h in sorted(set(ACTIONS) - set(calls))]
    for handler, needed in calls.items():
        problems += _differences(handler, needed, set(ACTIONS.get(handler, ())), "ACTIONS")
    assert not problems, "\n".join(problems)


def _role_actions(synth: Synth) -> dict[str, set[str]]:
    resources = synth.template(synth.home)["Resources"]
    roles: dict[str, set[str]] = {}
    for resource in resources.values():
        if resource["Type"] != "AWS::IAM::Policy":
            continue
        for statement in resource["Properties"]["PolicyDocument"]["Statement"]:
            assert statement["Effect"] == "Allow", statement
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            for role in resource["Properties"]["Roles"]:
                roles.setdefault(role["Ref"], set()).update(actions)
    out = {}
    for resource in resources.values():
        props: dict[str, Any] = resource.get("Properties", {})
        if resource["Type"] == "AWS::Lambda::Function" and str(props.get("Handler", "")).startswith("functions."):
            role = props["Role"]["Fn::GetAtt"][0]
            assert not resources[role]["Properties"].get("ManagedPolicyArns"), f"{role} has managed policies"
            assert not resources[role]["Properties"].get("Policies"), f"{role} has inline policies"
            out[props["Handler"].split(".")[1]] = roles.get(role, set())
    return out


def test_every_role_holds_exactly_what_its_code_calls(
    synth: Synth, calls: dict[str, dict[str, aws_calls.Call]]
) -> None:
    held = _role_actions(synth)
    assert sorted(held) == sorted(calls)
    problems = []
    for handler, needed in calls.items():
        problems += _differences(handler, needed, held[handler] - PLATFORM, "its role in the synthesized template")
        missing = PLATFORM - held[handler]
        if missing:
            problems.append(f"{handler}: its role lacks {sorted(missing)}: Lambda cannot write its logs/traces")
    assert not problems, "\n".join(problems)


def test_only_the_launching_task_may_create_instances_or_roles(synth: Synth) -> None:
    held = _role_actions(synth)
    assert held[LAUNCHER] >= CREATES
    for handler, actions in held.items():
        if handler.startswith("sfn_") and handler != LAUNCHER:
            assert not actions & CREATES, f"{handler} may {sorted(actions & CREATES)}; only {LAUNCHER} launches"
    assert not held["slack_notifier"] - PLATFORM - {"secretsmanager:GetSecretValue"}


def test_the_analysis_follows_ports_to_the_production_adapters() -> None:
    """PORT_ADAPTERS names the classes functions/_runtime.py builds; a chain goes through them."""
    source = (staging.ROOT / "functions" / "_runtime.py").read_text()
    built = {n.id for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Name)}
    for port, (module, cls) in aws_calls.PORT_ADAPTERS.items():
        if port not in ("objects", "events"):  # built by the handlers that use them, not _runtime
            assert cls in built, f"functions/_runtime.py does not build {cls} for {port}"
        assert aws_calls.imports.module_path(module) is not None, module
    found = aws_calls.Analyzer().calls("sfn_provision")
    chain = found["ec2:CreateFleet"].via
    assert chain[0] == "functions/sfn_provision.py:handler"
    assert "spotrelay.adapters.ec2_compute:Ec2Compute.launch" in chain
    assert "iam:PassRole" in found and "states:StartExecution" not in found


def test_security_doc_names_every_handler_role() -> None:
    doc = (staging.ROOT / "docs" / "security.md").read_text()
    missing = [h for h in staging.discover_handlers() if f"| `{h}` |" not in doc]
    assert not missing, f"docs/security.md's role table lacks {missing}"


def test_a_handlers_listing_names_only_its_own_prefixes(synth: Synth) -> None:
    """ListBucket lets a handler tell a deleted submission from a denial (S3 answers 403 for a missing key
    otherwise); it must not show the key names of checkpoints or code, so it is conditioned on the prefix."""
    from cdk.permissions import S3_PREFIXES

    resources = synth.template(synth.home)["Resources"]
    listing: dict[str, list[dict[str, Any]]] = {}
    for resource in resources.values():
        if resource["Type"] != "AWS::IAM::Policy":
            continue
        for statement in resource["Properties"]["PolicyDocument"]["Statement"]:
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            if "s3:ListBucket" in actions:
                for role in resource["Properties"]["Roles"]:
                    listing.setdefault(role["Ref"], []).append(statement)
    held = _role_actions(synth)
    listers = {h for h, acts in held.items() if "s3:ListBucket" in acts}
    assert listers == {"on_submission", "reconcile"}, listers
    assert len(listing) == len(listers)
    for statements in listing.values():
        assert all(s["Condition"] == {"StringLike": {"s3:prefix": [f"{p}*" for p in S3_PREFIXES["on_submission"]]}}
                   and s["Action"] == "s3:ListBucket" for s in statements), statements
