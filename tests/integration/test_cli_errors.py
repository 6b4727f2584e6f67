"""Every CLI command run against nothing (no credentials, an unreachable endpoint, a dead twin, a
deployment that is not there) prints one line that names the cause and what to do, never a
traceback, and exits 1 (runtime) or 2 (usage)."""

from __future__ import annotations

import enum
import errno
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError
from typer.testing import CliRunner

from spotrelay.cli import config
from spotrelay.cli.main import app
from tests.conftest import ROOT
from tests.hostile_corpus import EXPECT, corpus

TINY = str(ROOT / "examples" / "tiny.yaml")
# Commands that reach AWS or the twin, with arguments. A new command that talks to either belongs here.
NETWORK = {
    "submit": [TINY], "jobs": [], "status": ["job-x"], "cancel": ["job-x"],
    "describe": ["job-x"], "logs": ["job-x"], "cost": ["job-x"],  # the health helper's, when present
}
TWIN = {"nodes": [], "interrupt": ["1"], "kill": ["1"]}
_CREDENTIAL_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                   "AWS_DEFAULT_PROFILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                   "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_WEB_IDENTITY_TOKEN_FILE", "SPOTRELAY_TWIN_URL",
                   "SPOTRELAY_CONFIG", "AWS_DEFAULT_REGION")


def _commands() -> list[list[str]]:
    import typer.main

    group = typer.main.get_command(app)
    names = set(group.commands)  # type: ignore[attr-defined]
    return [[name, *args] for name, args in NETWORK.items() if name in names]


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def nowhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty home and working directory, no credentials anywhere, no instance metadata."""
    from spotrelay.settings import reset

    for name in (*_CREDENTIAL_ENV, *config.KEYS.values()):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("SPOTRELAY_AWS_MAX_ATTEMPTS", "1")
    monkeypatch.chdir(tmp_path)
    reset()
    yield tmp_path
    reset()


def _one_line(args: list[str], codes: tuple[int, ...] = (1,)) -> str:
    result = CliRunner().invoke(app, args)
    text = result.output.strip()
    assert "Traceback" not in text and isinstance(result.exception, SystemExit), (args, text, result.exception)
    assert result.exit_code in codes, (args, result.exit_code, text)
    assert len(text.splitlines()) == 1 and text.startswith("error: "), (args, text)
    return text


@pytest.mark.parametrize("args", _commands(), ids=lambda a: a[0])
def test_without_credentials(nowhere: Path, args: list[str]) -> None:
    assert "no AWS credentials found" in _one_line(args)


@pytest.mark.parametrize("args", _commands(), ids=lambda a: a[0])
def test_with_an_unreachable_endpoint(nowhere: Path, args: list[str]) -> None:
    port = _closed_port()
    line = _one_line([*args, "--endpoint-url", f"http://127.0.0.1:{port}"])
    assert f"cannot reach http://127.0.0.1:{port}" in line and "spotrelay local up" in line


@pytest.mark.parametrize("args", [*_commands(), *[["local", n, *a] for n, a in TWIN.items()]], ids=lambda a: a[-1])
def test_against_a_twin_that_died_and_left_its_files(nowhere: Path, args: list[str]) -> None:
    """`spotrelay local up` wrote .spotrelay.toml and .spotrelay-twin.json, then was killed."""
    config.write_file(nowhere / ".spotrelay.toml", {"endpoint_url": f"http://127.0.0.1:{_closed_port()}"})
    (nowhere / ".spotrelay-twin.json").write_text(json.dumps({"control_url": f"http://127.0.0.1:{_closed_port()}"}))
    line = _one_line(args)
    assert "cannot reach" in line or "does not answer" in line


@pytest.mark.parametrize("name", sorted(TWIN))
def test_twin_commands_without_a_twin_are_usage_errors(nowhere: Path, name: str) -> None:
    assert "no running twin" in _one_line(["local", name, *TWIN[name]], codes=(2,))


def test_a_deployment_that_is_not_there(aws: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPOTRELAY_JOBS_TABLE", "no-such-table")
    monkeypatch.setenv("SPOTRELAY_AWS_MAX_ATTEMPTS", "1")
    line = _one_line(["jobs"])
    assert "not found calling" in line and "--table" in line
    assert "not found" in _one_line(["status", "job-x"])


@pytest.mark.parametrize(("code", "expected"), [("AccessDeniedException", "access denied calling Scan"),
                                                ("ExpiredTokenException", "log in again"),
                                                ("403", "access denied calling Scan"),  # (a HEAD: no body)
                                                ("ResourceNotFoundException", "not found calling Scan"),
                                                ("ThrottlingException", "AWS refused Scan (ThrottlingException)")])
def test_aws_refusals_read_as_one_line(code: str, expected: str) -> None:
    from spotrelay.cli.errors import explain

    exc = ClientError({"Error": {"Code": code, "Message": "m"}}, "Scan")
    line, exit_code = explain(exc)
    assert expected in line and exit_code == 1 and "\n" not in line


def test_validate_refuses_the_whole_hostile_corpus_with_exit_2(tmp_path: Path) -> None:
    for name, body in corpus().items():
        path = tmp_path / name
        path.write_bytes(body)
        result = CliRunner().invoke(app, ["validate", str(path)])
        assert result.exit_code == 2 and "Traceback" not in result.output, (name, result.output)
        assert isinstance(result.exception, SystemExit) and EXPECT[name] in " ".join(result.output.split()), name


def test_an_invalid_spec_is_named_whole_and_as_written(tmp_path: Path) -> None:
    """A long path is not wrapped at the terminal's width, and brackets in it are not read as markup."""
    folder = tmp_path / ("runs-" * 20)
    folder.mkdir()
    path = folder / "job[1].yaml"
    path.write_text(Path(TINY).read_text().replace("nodes: 2", "nodes: two"))
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 2 and result.output.splitlines()[0] == f"invalid spec {path}", result.output


def test_a_spec_name_with_a_newline_keeps_the_header_on_one_line(tmp_path: Path) -> None:
    path = tmp_path / "a\nb.yaml"
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 2 and result.output.splitlines() == [
        f"error: {tmp_path}/a\\nb.yaml: cannot be read: No such file or directory"], result.output


def test_validate_of_a_missing_file_is_a_usage_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["validate", str(tmp_path / "gone.yaml")])
    assert result.exit_code == 2 and "cannot be read" in result.output


@pytest.mark.parametrize("command", ["validate", "submit"])
def test_a_spec_file_that_cannot_be_read_is_one_line_naming_it(
        tmp_path: Path, command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder, a file without read permission, a missing one, bytes that are not UTF-8: one line with the
    file and the cause, exit 2, before anything is sent (it was `invalid spec FILE` over `(file): ...`, as if
    a field were wrong)."""
    from spotrelay.spec import load

    folder, locked, latin = tmp_path / "folder.yaml", tmp_path / "locked.yaml", tmp_path / "latin.yaml"
    folder.mkdir()
    locked.write_text(Path(TINY).read_text())
    locked.chmod(0)
    latin.write_bytes("name: caf\xe9\n".encode("latin-1"))
    real = load.read_bounded

    def read(path: str | Path, limit: int) -> bytes:  # (root reads a mode-000 file: its refusal stood in for)
        if Path(path) == locked and os.access(locked, os.R_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return real(path, limit)

    monkeypatch.setattr(load, "read_bounded", read)
    for path, cause in ((folder, "cannot be read: Is a directory"), (locked, "cannot be read: Permission denied"),
                        (tmp_path / "gone.yaml", "cannot be read: No such file or directory"),
                        (latin, "is not UTF-8 text (byte 0xe9 at offset 9); save it as UTF-8")):
        result = CliRunner().invoke(app, [command, str(path)])
        assert result.exit_code == 2 and result.output.splitlines() == [f"error: {path}: {cause}"], result.output


@pytest.mark.parametrize("blank", ["", " "], ids=repr)
@pytest.mark.parametrize(("args", "named"), [
    (["validate"], "'FILE'"), (["submit"], "'FILE'"), (["resume", "job-x", "--spec"], "'--spec'"),
    (["demo", "--spec"], "'--spec'"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_an_empty_spec_path_is_a_usage_error_naming_the_argument(
        nowhere: Path, args: list[str], named: str, blank: str) -> None:
    """An empty or blank path (an unset shell variable) names the argument, exit 2, before any AWS call (as a
    Path it was ".", refused as `error: .: has no suffix` or read as the current folder)."""
    line = _one_line([*args, blank], codes=(2,))
    assert f"invalid value for {named}: {blank!r} names no file" in line, line


def _tree() -> tuple[list[list[str]], list[tuple[list[str], Any]]]:
    """(group paths, (leaf path, command)) of the whole app, so a new command is covered by itself."""
    import typer.main

    groups: list[list[str]] = []
    leaves: list[tuple[list[str], Any]] = []

    def walk(cmd: Any, path: list[str]) -> None:
        subs = getattr(cmd, "commands", None)
        if subs is None:
            leaves.append((path, cmd))
            return
        groups.append(path)
        for name, sub in subs.items():
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return groups, leaves


def _bad_values(path: list[str], cmd: Any) -> list[list[str]]:
    """A number option given a word, a choice given a value outside it."""
    cases = []
    for param in cmd.params:
        kind = getattr(getattr(param, "type_descriptor", None), "annotation", None)
        opts = [o for o in getattr(param, "opts", []) if o.startswith("--")]
        if not opts or getattr(param, "is_flag", False):
            continue
        if kind in (int, float) or (isinstance(kind, type) and issubclass(kind, enum.Enum)):
            cases.append([*path, opts[0], "no-such-value"])
    return cases


_GROUPS, _LEAVES = _tree()
_USAGE_CASES = [
    *[[*path, "no-such-command"] for path in _GROUPS],
    *[[*path, "--no-such-option"] for path, _ in _LEAVES],
    *[path for path, cmd in _LEAVES if any(p.required for p in cmd.params)],  # a missing argument
    *[case for path, cmd in _LEAVES for case in _bad_values(path, cmd)],
]


@pytest.mark.parametrize("args", _USAGE_CASES, ids=" ".join)
def test_usage_errors_are_one_line_and_exit_2(args: list[str]) -> None:
    line = _one_line(args, codes=(2,))
    assert "Usage" not in line and line.endswith("--help'."), line
    assert any(word in line for word in ("no such", "missing", "invalid value")), line


_JOB_COMMANDS = ("status", "cancel", "describe", "logs", "cost", "resume")


@pytest.mark.parametrize("job", ["", "  ", " job-x", "a\tb", "a\nb", "x" * 3000], ids=repr)
@pytest.mark.parametrize("command", _JOB_COMMANDS)
def test_a_job_argument_that_is_no_id_is_a_usage_error_before_any_aws_call(
        nowhere: Path, command: str, job: str) -> None:
    """No credentials anywhere: an AWS call would end as "no AWS credentials found" (exit 1). An
    empty JOB used to reach DynamoDB and come back as its ValidationException."""
    line = _one_line([command, job], codes=(2,))
    assert "invalid value for 'JOB'" in line and ("empty" in line or "is not a job id" in line), line
    assert len(line) < 300, line


def test_a_job_argument_shaped_like_an_id_goes_on_to_aws(nowhere: Path) -> None:
    assert "no AWS credentials found" in _one_line(["status", "x/../y"])


def test_the_usage_tree_covers_every_kind_of_mistake() -> None:
    """The enumeration above is not vacuous: every command, the sub-app, and some bad values."""
    names = {" ".join(path) for path, _ in _LEAVES}
    assert {"submit", "describe", "logs", "cost", "simulate", "local chaos", "local up"} <= names
    assert [] in _GROUPS and ["local"] in _GROUPS
    assert any(case[-1] == "no-such-value" for case in _USAGE_CASES)


def test_a_bare_group_still_shows_its_help() -> None:
    result = CliRunner().invoke(app, ["local"])
    assert "Usage" in result.output and "chaos" in result.output and "Traceback" not in result.output


_WRITES_INTO_A_CLOSED_PIPE = """
import os, typer
from spotrelay.cli.errors import SpotrelayGroup
read, write = os.pipe()
os.close(read)  # the reader (say `head`) is gone before anything is written: no race
os.dup2(write, 1)
app = typer.Typer(cls=SpotrelayGroup)
@app.command()
def table() -> None:
    typer.echo("row\\n" * 100_000)  # past any buffer: the write itself fails
@app.command()
def other() -> None: ...
app(["table"])
"""


def test_output_into_a_closed_pipe_is_no_error_line() -> None:
    """`spotrelay ... | head`: the reader went before the output was all written. That is no failure to
    name (it once read "cannot connect: [Errno 32] Broken pipe; is the endpoint running?"): the command
    exits 1 with nothing on stderr, as click does for a closed pipe."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _WRITES_INTO_A_CLOSED_PIPE], stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, cwd=ROOT, timeout=120)
    assert done.stderr == "" and done.returncode == 1, done.stderr


def test_a_broken_pipe_elsewhere_still_reads_as_a_connection_failure() -> None:
    """A broken pipe that is not standard output's (a socket's) stays a one-line connection error."""
    import typer

    from spotrelay.cli.errors import SpotrelayGroup

    tiny = typer.Typer(cls=SpotrelayGroup)

    @tiny.command()
    def fetch() -> None:
        raise BrokenPipeError(32, "Broken pipe")

    @tiny.command()
    def other() -> None: ...

    result = CliRunner().invoke(tiny, ["fetch"])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert result.output.startswith("error: cannot connect") and result.output.count("\n") == 1, result.output


@pytest.mark.parametrize("where", ["missing.toml", "."])
def test_a_config_named_by_spotrelay_config_that_is_not_there_is_named(
        nowhere: Path, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    """A typo in $SPOTRELAY_CONFIG fell through to ./.spotrelay.toml, or to AWS, silently."""
    monkeypatch.setenv("SPOTRELAY_CONFIG", where)
    config.write_file(nowhere / ".spotrelay.toml", {"endpoint_url": f"http://127.0.0.1:{_closed_port()}"})
    line = _one_line(["jobs"], codes=(2,))
    assert line == f"error: SPOTRELAY_CONFIG {where}: is not a file (point it at the config file, or unset it)"


def test_a_config_file_that_is_not_text_is_named(nowhere: Path) -> None:
    (nowhere / ".spotrelay.toml").write_bytes(b"\xeb\xff binary")
    line = _one_line(["jobs"], codes=(2,))
    assert line.startswith("error: .spotrelay.toml: cannot read the spotrelay config: 'utf-8' codec"), line
