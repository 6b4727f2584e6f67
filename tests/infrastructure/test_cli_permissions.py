"""docs/security.md's table of what the CLI's user needs holds what each command's code can call.

The Lambda grants' analyzer (tests/infrastructure/aws_calls.py) walks each command from its function, as
it walks a handler; the table is read from the doc. A difference fails naming the command, the action and
the call chain (or the table's cell), so the doc people build their IAM policies from stays true.
"""

from __future__ import annotations

import re

import pytest

from tests.conftest import ROOT
from tests.infrastructure.aws_calls import Analyzer

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
# what the table asks for beyond the calls, and why
BEYOND_CALLS = {
    "submit": {"s3:ListBucket"},  # S3 answers the HeadObject of a missing archive with 403 without it
}
SECTION = "**What the CLI's user needs.**"


def _documented() -> dict[str, set[str]]:
    text = (ROOT / "docs" / "security.md").read_text()
    assert SECTION in text, f"docs/security.md lost its section {SECTION}"
    rows = text.split(SECTION, 1)[1].split("\n\n", 2)[1]  # (the paragraph, then the table)
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


def test_the_table_names_every_command() -> None:
    assert sorted(_documented()) == sorted(COMMANDS)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_each_command_needs_what_the_table_says(analyzer: Analyzer, command: str) -> None:
    module, name = COMMANDS[command]
    found = analyzer.calls_from((module, name), f"{module}:{name}")
    assert NOT_CALLED.get(command, set()) <= set(found), f"{command}: the allowance has outlived its reason"
    called = set(found) - NOT_CALLED.get(command, set())
    documented = _documented()[command]
    problems = [f"`{command}` calls {a} ({found[a].chain()}): add it to its row of docs/security.md"
                for a in sorted(called - documented)]
    problems += [f"`{command}`'s row of docs/security.md names {a}, which its code never calls: remove it"
                 for a in sorted(documented - called - BEYOND_CALLS.get(command, set()))]
    assert not problems, "\n".join(problems)
