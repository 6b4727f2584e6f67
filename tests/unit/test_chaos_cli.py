"""``spotrelay local chaos`` refuses bad input in one line (exit 2) before it starts a twin: a
campaign runs for minutes to half an hour, and its result must have somewhere to go."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from spotrelay.cli.main import app


def _refused(args: list[str]) -> str:
    result = CliRunner().invoke(app, ["local", "chaos", *args])
    text = result.output.strip()
    assert result.exit_code == 2 and "Traceback" not in text, (args, result.exit_code, text, result.exception)
    assert len(text.splitlines()) == 1 and text.startswith("error: "), text
    return text


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--faults", "kill,explode"], "explode"),
        (["--faults", "kill,,spot-notice,S3-DELETE"], "S3-DELETE"),
        (["--faults", " , "], "names no fault kind"),
        (["--jobs", "0"], "--jobs"),
        (["--jobs", "-3"], "--jobs must be at least 1, not -3"),
        (["--parallel", "0"], "--parallel"),
        (["--steps", "0"], "--steps"),
        (["--max-faults", "-1"], "--max-faults"),
        (["--job-timeout", "0"], "--job-timeout"),
        (["--job-timeout", "nan"], "--job-timeout"),
        (["--job-timeout", "inf"], "--job-timeout"),  # was accepted: a stuck job would never be counted
        (["--job-timeout", "86401"], "at most 86400 seconds"),
    ],
)
def test_bad_numbers_and_kinds_are_named(args: list[str], named: str, tmp_path: Path) -> None:
    assert named in _refused([*args, "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()  # refused before anything was started or written


def test_a_json_file_that_cannot_be_written_is_refused_before_the_run(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    out = ["--out", str(tmp_path / "out")]
    assert "--json" in _refused([*out, "--json", str(blocker / "result.json")])
    assert "--json" in _refused([*out, "--json", str(tmp_path)])  # a directory
    assert not (tmp_path / "out" / "twin.log").read_text()  # no twin was started


def test_an_out_dir_that_cannot_be_made_is_refused(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    assert "--out" in _refused(["--out", str(blocker / "out")])
