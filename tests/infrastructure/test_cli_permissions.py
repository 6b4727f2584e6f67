"""What the CLI's user needs: cdk/cli_access.py's list holds what each command's code can call, and
docs/security.md's table and the stack's two managed policies hold that list.

The Lambda grants' analyzer (tests/infrastructure/aws_calls.py) walks each command from its function, as
it walks a handler. A difference fails naming the command, the action and the call chain (or the table's
cell), so the policies people attach and the doc they read stay true. tests/integration/test_cli_policies.py
runs the commands under those policies with IAM enforced.
"""

from __future__ import annotations

import re

import pytest

from cdk import cli_access
from cdk.nag import flatten
from tests.conftest import ROOT
from tests.infrastructure.aws_calls import Analyzer
from tests.infrastructure.conftest import Synth

COMMANDS = {
    "submit": ("spotrelay.cli.main", "submit"),
    "jobs": ("spotrelay.cli.main", "jobs"),
    "status": ("spotrelay.cli.main", "status"),
    "cancel": ("spotrelay.cli.main", "cancel"),
    "describe": ("spotrelay.cli.inspect", "describe"),
    "cost": ("spotrelay.cli.inspect", "cost"),
    "logs": ("spotrelay.cli.inspect", "logs"),
    "resume": ("spotrelay.cli.resume", "resume"),
}
# what the analyzer finds that the command never calls, and why (it resolves a port by its parameter's name)
NOT_CALLED = {
    "describe": {"ec2:DescribeSpotPriceHistory", "ec2:DescribeAvailabilityZones", "ec2:GetSpotPlacementScores"},
    # (describe_job's `market` is StaticMarketData there: the catalog's prices, no AWS call)
}
# what the policies ask for beyond the calls, and why
BEYOND_CALLS = {
    "submit": {"s3:ListBucket"},  # S3 answers the HeadObject of a missing archive with 403 without it
}
SECTION = "**What the CLI's user needs.**"
TABLE = "| command | actions |"


def _documented() -> dict[str, set[str]]:
    text = (ROOT / "docs" / "security.md").read_text()
    assert SECTION in text, f"docs/security.md lost its section {SECTION}"
    section = text.split(SECTION, 1)[1]
    assert TABLE in section, f"docs/security.md's section {SECTION} lost its table"
    rows = (TABLE + section.split(TABLE, 1)[1]).split("\n\n", 1)[0]
    out: dict[str, set[str]] = {}
    for line in rows.splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        actions = set(re.findall(r"`([a-z0-9]+:[A-Za-z]+)`", cells[1]))
        for command in re.findall(r"`([a-z]+)`", cells[0]):
            out[command] = actions
    return out


@pytest.fixture(scope="module")
def analyzer() -> Analyzer:
    return Analyzer()


def _listed(command: str) -> set[str]:
    return {action for action, _ in cli_access.COMMANDS[command]}


def test_the_table_names_every_command() -> None:
    assert sorted(_documented()) == sorted(COMMANDS) == sorted(cli_access.COMMANDS)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_each_command_needs_what_its_policy_lists(analyzer: Analyzer, command: str) -> None:
    module, name = COMMANDS[command]
    found = analyzer.calls_from((module, name), f"{module}:{name}")
    assert NOT_CALLED.get(command, set()) <= set(found), f"{command}: the allowance has outlived its reason"
    called = set(found) - NOT_CALLED.get(command, set())
    listed = _listed(command)
    problems = [f"`{command}` calls {a} ({found[a].chain()}): add it to its line of cdk/cli_access.py COMMANDS"
                for a in sorted(called - listed)]
    problems += [f"cdk/cli_access.py lists {a} for `{command}`, which its code never calls: remove it"
                 for a in sorted(listed - called - BEYOND_CALLS.get(command, set()))]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_the_doc_says_what_the_policy_lists(command: str) -> None:
    documented, listed = _documented()[command], _listed(command)
    assert documented == listed, (f"`{command}`: docs/security.md's row names {sorted(documented - listed)} "
                                  f"beyond cdk/cli_access.py, which lists {sorted(listed - documented)} beyond it")


READS = ("Get", "Query", "Scan", "List", "Describe")


def test_the_stack_holds_both_policies_on_its_own_resources_only(synth: Synth) -> None:
    """Each managed policy allows exactly its commands' actions, each on a named resource of this
    deployment (no ``*`` of any kind but object prefixes and log streams), and the viewer only reads."""
    policies = {r["Properties"]["ManagedPolicyName"]: r["Properties"]
                for r in synth.resources(synth.home, "AWS::IAM::ManagedPolicy").values()}
    for name, commands in cli_access.POLICIES.items():
        props = policies[f"spotrelay-{name}"]
        statements = props["PolicyDocument"]["Statement"]
        actions = {a for s in statements for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])}
        assert actions == {a for c in commands for a in _listed(c)}, name
        assert all(s["Effect"] == "Allow" and "Condition" not in s for s in statements)
        for statement in statements:
            listed = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
            for resource in (flatten(r) for r in listed):
                assert resource.count("*") <= 1 and (not resource.endswith("*") or resource.endswith(
                    ("/code/*", "/submissions/*", "/spotrelay/training:*"))), resource
                assert "/checkpoints/" not in resource or resource.endswith("/checkpoints/*/manifest.json")
                assert re.search(r"table/spotrelay-(jobs|nodes)(/index/by-status)?$|s3:::spotrelay-(jobs|data)-"
                                 r"|log-group:/spotrelay/training|stateMachine:spotrelay-job-run$", resource), resource
        # a job's checkpoints may be in a training region's data bucket: its manifests are readable there too
        manifests = {flatten(r) for s in statements for r in (s["Resource"] if isinstance(s["Resource"], list)
                                                             else [s["Resource"]]) if "manifest" in flatten(r)}
        assert {m.split(":::")[1].split("-")[1] for m in manifests} == {"jobs", "data"}, manifests
        assert len(manifests) == 1 + len(synth.config.training_regions), manifests
    viewer = {a for c in cli_access.POLICIES["cli-viewer"] for a in _listed(c)}
    assert all(a.split(":")[1].startswith(READS) for a in viewer), sorted(viewer)
    outputs = synth.template(synth.home)["Outputs"]
    assert {"CliUserPolicyArn", "CliViewerPolicyArn"} <= set(outputs)


def test_an_unknown_command_is_named() -> None:
    with pytest.raises(ValueError, match="no command 'deploy'"):
        cli_access.statements(["jobs", "deploy"], cli_access.Deployment("aws", "1", "r", "b", "j", "n", "m"))
