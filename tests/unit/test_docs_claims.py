"""What docs/ says about a command or the agent is what the code does: option by option, try by try."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.conftest import ROOT


def _usage_lines() -> list[str]:
    """The command column of cli.md's table: `spotrelay NAME ...`, one command a row."""
    text = (ROOT / "docs" / "cli.md").read_text()
    cells = re.findall(r"^\| `(spotrelay (?:[^`]|`(?!\s*\|))*)` \|", text, re.M)
    return [c.replace("\\|", "|") for c in cells if " / " not in c]


def _options(usage: str) -> list[tuple[str, bool]]:
    """(option, shown as required: outside every bracket) of a usage line."""
    found, depth = [], 0
    for token in re.finditer(r"\[|\]|--[a-z][a-z0-9-]*", usage):
        text = token.group()
        depth += {"[": 1, "]": -1}.get(text, 0)
        if text.startswith("--"):
            found.append((text, depth == 0))
    return found


def _command(usage: str) -> Any:
    import typer.main

    from spotrelay.cli.main import app

    cmd: Any = typer.main.get_command(app)
    for word in usage.split()[1:]:
        subs = getattr(cmd, "commands", None)
        if subs is None or word not in subs:
            break
        cmd = subs[word]
    return cmd


@pytest.mark.parametrize("usage", _usage_lines(), ids=lambda u: " ".join(u.split()[:2]))
def test_a_usage_line_brackets_exactly_the_optional_options(usage: str) -> None:
    """cli.md showed `simulate --trace FILE ... --nodes N` as if both were required: --nodes defaults to 16,
    and --trace is refused with the synthetic market."""
    params = {opt: p for p in _command(usage).params for opt in getattr(p, "opts", [])}
    for option, shown_required in _options(usage):
        assert option in params, f"{option} is no option of {usage.split()[:2]}"
        assert shown_required == bool(params[option].required), (option, usage[:80])


def test_the_usage_lines_are_read() -> None:
    names = {" ".join(u.split()[:2]) for u in _usage_lines()}
    assert {"spotrelay simulate", "spotrelay resume", "spotrelay local"} <= names, names
    assert len(_options(next(u for u in _usage_lines() if u.startswith("spotrelay simulate")))) > 10


def test_agent_md_says_how_often_a_put_events_is_tried(monkeypatch: pytest.MonkeyPatch) -> None:
    """agent.md said a failed PutEvents is "retried three times": it is tried three times in all."""
    from types import SimpleNamespace

    from agent import reporting

    words = {"once": 1, "twice": 2, "two": 2, "three": 3, "four": 4, "five": 5}
    said = re.search(r"A PutEvents is tried (\w+) times in all", (ROOT / "docs" / "agent.md").read_text())
    assert said is not None
    calls: list[object] = []

    def report(event: object) -> None:
        calls.append(event)
        raise ConnectionError("EventBridge is down")

    monkeypatch.setattr(reporting.time, "sleep", lambda s: None)
    reporter = reporting.Reporter(SimpleNamespace(), SimpleNamespace(report=report))  # type: ignore[arg-type]
    assert reporter.publish(SimpleNamespace(model_dump=lambda mode: {}, kind="Heartbeat")) is False  # type: ignore[arg-type]
    assert len(calls) == words[said.group(1)]
