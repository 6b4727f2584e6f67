"""``spotrelay demo`` and ``spotrelay local up`` refuse bad input in one line (exit 2) before a twin
starts or a file is touched: a number that is no number (NaN, inf, out of range), a spec that is not
one, an --out that holds someone's files (the demo empties its folder) or is a file, a --json that
cannot be written. And once a twin's logs own fd 2, an error line still reaches the terminal."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from spotrelay.cli.main import app
from spotrelay.local.demo import clear_out

ROOT = Path(__file__).resolve().parents[2]
HANG_S = 300.0  # a wait's bound that only catches a hang (a loaded CI machine may be slow, never this slow)


def _refused(args: list[str]) -> str:
    result = CliRunner().invoke(app, args)
    text = result.output.strip()
    assert result.exit_code == 2 and "Traceback" not in text, (args, result.exit_code, text, result.exception)
    assert text.startswith(("error: ", "invalid spec")), text
    return text


@pytest.mark.parametrize(("args", "named"), [
    (["demo", "--timeout-s", "nan"], "'--timeout-s': nan is not a number above 0 and at most 86400"),
    (["demo", "--timeout-s", "-1"], "'--timeout-s': -1 is not a number above 0"),  # ran the whole demo
    (["demo", "--s3-mb-s", "inf"], "'--s3-mb-s': inf is not a number"),
    (["local", "up", "--boot-s", "nan"], "'--boot-s': nan is not a number from 0 to 86400"),  # started a twin
    (["local", "up", "--time-scale", "0"], "'--time-scale': 0 is not a number above 0"),
    (["local", "up", "--notice-s", "-5"], "'--notice-s': -5 is not a number above 0"),
    (["local", "up", "--speedup", "inf"], "'--speedup': inf is not a number"),
    (["local", "up", "--s3-mb-s", "nan"], "'--s3-mb-s': nan is not a number"),
])
def test_bad_numbers_are_named_in_one_line(args: list[str], named: str, tmp_path: Path) -> None:
    text = _refused([*args, *(["--out", str(tmp_path / "out")] if args[0] == "demo" else ["--dir", str(tmp_path)])])
    assert len(text.splitlines()) == 1 and named in text, text
    assert not (tmp_path / "out").exists()


def test_demo_refuses_a_spec_that_is_not_one_before_it_touches_out(tmp_path: Path) -> None:
    out = tmp_path / "out"
    missing = _refused(["demo", "--spec", str(tmp_path / "nope.yaml"), "--out", str(out)])
    assert missing == f"error: {tmp_path / 'nope.yaml'}: cannot be read: No such file or directory"
    latin = tmp_path / "latin.yaml"
    latin.write_bytes("name: caf\xe9\n".encode("latin-1"))  # (was the codec's line, no file named)
    assert _refused(["demo", "--spec", str(latin), "--out", str(out)]) == \
        f"error: {latin}: is not UTF-8 text (byte 0xe9 at offset 9); save it as UTF-8"
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\n")  # (was a KeyError written only to out/twin.log: nothing on the terminal)
    text = _refused(["demo", "--spec", str(bad), "--out", str(out)])
    assert text.splitlines()[0] == f"invalid spec {bad}" and "entrypoint: Field required" in text
    assert not out.exists()


def test_demo_never_empties_a_folder_that_is_not_a_demos(tmp_path: Path) -> None:
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep")
    assert "holds files that are not a demo's output" in _refused(["demo", "--out", str(precious)])
    assert (precious / "notes.txt").read_text() == "keep"
    assert "is a file, not a folder" in _refused(["demo", "--out", str(precious / "notes.txt")])
    assert "--json" in _refused(["demo", "--out", str(tmp_path / "o"), "--json", str(precious / "notes.txt" / "x")])
    assert (precious / "notes.txt").read_text() == "keep"


def test_clear_out_empties_a_previous_demos_folder_or_makes_one(tmp_path: Path) -> None:
    previous = tmp_path / "demo-out"
    (previous / "reference").mkdir(parents=True)
    (previous / "twin.log").write_text("old run")
    (previous / "reference" / "model.pt").write_bytes(b"x")
    clear_out(previous)
    assert previous.is_dir() and not any(previous.iterdir())
    clear_out(previous)  # empty: stays
    fresh = tmp_path / "a" / "b"
    clear_out(fresh)
    assert fresh.is_dir()


def test_an_error_after_the_twin_took_the_logs_reaches_the_terminal(tmp_path: Path) -> None:
    """quiet_logs sends fd 1 and 2 to twin.log; a failure then (a twin that cannot start, a timeout) was
    written there alone and the command exited 2 with nothing on the terminal."""
    script = (
        "from pathlib import Path; import sys\n"
        "from spotrelay.local.twinlog import quiet_logs\n"
        "from spotrelay.cli.errors import raise_one_line\n"
        f"quiet_logs(Path({str(tmp_path / 'twin.log')!r}))\n"
        "print('a library line', file=sys.stderr)\n"
        "try:\n    raise_one_line(ValueError('the twin did not start'))\n"
        "except BaseException as exc:\n    sys.exit(getattr(exc, 'exit_code', 99))\n"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2, done
    assert done.stderr.strip() == "error: the twin did not start"
    assert "a library line" in (tmp_path / "twin.log").read_text()
    assert "the twin did not start" not in (tmp_path / "twin.log").read_text()


@pytest.mark.parametrize("glob", ["[", "us-east-1/p5.48xlarge/spot", "us-east-1/*/p5.48xlarge/spto"])
def test_local_up_refuses_a_capacity_error_glob_that_names_no_pool(glob: str, tmp_path: Path) -> None:
    text = _refused(["local", "up", "--capacity-error", glob, "--dir", str(tmp_path)])
    assert f"--capacity-error {glob!r}: matches no pool; a pool is REGION/AZ/TYPE/MARKET" in text  # (ran without it)


@pytest.mark.parametrize("glob", ["*", "us-east-1/*", "us-west-2/*/p4d.24xlarge/on-demand",
                                  "us-east-1/*/g5.xlarge/spot"])
def test_a_capacity_error_glob_that_can_match_a_pool_is_taken(glob: str) -> None:
    from spotrelay.cli.local import _check_pool_glob

    _check_pool_glob(glob, ["us-east-1", "us-west-2"])  # (no refusal: these start the twin)


def test_logs_dir_must_be_a_folder() -> None:
    text = _refused(["logs", "job-x", "--dir", "/dev/null"])  # (read as a folder without logs)
    assert text == "error: --dir /dev/null: not a folder (the twin's work dir)"


def test_local_up_refuses_a_state_file_it_cannot_write_before_the_twin_starts(tmp_path: Path) -> None:
    text = _refused(["local", "up", "--dir", str(tmp_path / "twin"), "--state", str(tmp_path)])
    assert text == f"error: --state {tmp_path}: is a directory"
    assert not (tmp_path / "twin").exists()  # (the twin had started: its folder and log were made)


@pytest.mark.parametrize(("make", "named"), [
    (lambda p: p.write_text("[1]"), "not a twin state file"),  # was "unexpected TypeError" (exit 1)
    (lambda p: p.write_bytes(b"\xff\xfe\x00"), "not a twin state file"),  # was "no running twin"
    (lambda p: p.write_text('{"control_url": 5}'), "not a twin state file"),
    (lambda p: p.mkdir(), "cannot read the twin's state file (Is a directory)"),
    (lambda p: p.symlink_to("/dev/zero"), "not a twin state file"),  # read for ever
    (lambda p: os.mkfifo(p), "not a twin state file"),  # waited for ever in open()
])
def test_a_state_file_that_is_not_one_is_named(make: Callable[[Path], object], named: str, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPOTRELAY_TWIN_URL", raising=False)
    state = tmp_path / "twin.json"
    make(state)
    result: list[str] = []
    caller = threading.Thread(target=lambda: result.append(_refused(["local", "nodes", "--state", str(state)])),
                              daemon=True)
    caller.start()
    caller.join(HANG_S)
    assert result, f"still reading {state} after {HANG_S:.0f} s"
    assert result[0].startswith(f"error: {state}: {named}"), result[0]


@pytest.mark.parametrize("command", [["local", "up", "--dir"], ["local", "chaos", "--out"]])
def test_a_work_folder_that_is_a_file_is_named_as_one(command: list[str], tmp_path: Path) -> None:
    blocker = tmp_path / "afile"
    blocker.write_text("someone's")
    assert _refused([*command, str(blocker)]) == f"error: {command[-1]} {blocker}: is a file, not a folder"  # was
    # "File exists"
    text = _refused([*command, str(blocker / "sub")])
    assert text == f"error: {command[-1]} {blocker / 'sub'}: {blocker} is a file, not a folder"
    assert blocker.read_text() == "someone's"


def test_after_quiet_logs_a_captured_stderr_still_gets_the_error(tmp_path: Path) -> None:
    """In a process whose twin took fd 2 (an in-process demo or chaos test before this one), a command
    run under a capture (CliRunner swaps sys.stderr) still prints its error there, not to the terminal."""
    script = (
        "from pathlib import Path\n"
        "from typer.testing import CliRunner\n"
        "from spotrelay.cli.main import app\n"
        "from spotrelay.local.twinlog import quiet_logs\n"
        f"quiet_logs(Path({str(tmp_path / 'twin.log')!r}))\n"
        f"out = CliRunner().invoke(app, ['demo', '--spec', {str(tmp_path / 'nope.yaml')!r}]).output\n"
        "assert 'nope.yaml: cannot be read: No such file or directory' in out, out\n"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "MLFLOW_DISABLE_TELEMETRY": "true"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, (done.stderr, (tmp_path / "twin.log").read_text()[-2000:])


class _Twin:
    """A twin that starts and stops at once (the command's file handling is under test, not the twin)."""

    def __init__(self, options: object) -> None:
        self.env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "SPOTRELAY_BUCKET": "twin-bucket"}
        self.compute = object()

    def start(self) -> _Twin:
        return self

    def stop(self) -> None: ...


class _Part:
    url = "http://127.0.0.1:9"

    def __init__(self, *args: object) -> None: ...

    def start(self) -> _Part:
        return self

    def stop(self) -> None: ...


def _up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """``spotrelay local up`` in ``tmp_path`` with a stand-in twin, stopped by SIGTERM at once."""
    import io
    import signal

    import spotrelay.local.chaos as chaos
    import spotrelay.local.control as control
    import spotrelay.local.twin as twin
    import spotrelay.local.twinlog as twinlog

    shown = io.StringIO()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(twin, "Twin", _Twin)
    monkeypatch.setattr(control, "ControlServer", _Part)
    monkeypatch.setattr(chaos, "ChaosDriver", _Part)
    monkeypatch.setattr(twinlog, "quiet_logs", lambda path: shown)
    monkeypatch.setattr(signal, "signal", lambda signum, handler: handler(signum, None))  # SIGTERM now
    result = CliRunner().invoke(app, ["local", "up", "--dir", str(tmp_path / "twin")])
    assert result.exit_code == 0, (result.output, result.exception)
    return shown.getvalue()


def test_local_up_writes_its_config_and_removes_it_when_it_stops(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from spotrelay.cli import config

    seen: list[str] = []
    original = config.write_file

    def write(path: Path, values: dict[str, str], header: str | None = None) -> None:
        original(path, values, header)
        seen.append(path.read_text())

    monkeypatch.setattr(config, "write_file", write)
    shown = _up(tmp_path, monkeypatch)
    assert seen and seen[0].startswith(config.TWIN_MARK) and 'bucket = "twin-bucket"' in seen[0]
    assert not (tmp_path / ".spotrelay.toml").exists() and "written now" in shown
    # a file a killed twin left (its mark on the first line) is the twin's to replace and remove
    config.write_file(tmp_path / ".spotrelay.toml", {"bucket": "stale"}, header=config.TWIN_MARK)
    _up(tmp_path, monkeypatch)
    assert not (tmp_path / ".spotrelay.toml").exists()


def test_local_up_leaves_a_users_own_config_as_it_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """It wrote the twin's endpoint over the user's file and deleted it when it stopped: their AWS
    settings were lost."""
    mine = '# my team\nregion = "eu-west-1"\nbucket = "prod-jobs"\n'
    (tmp_path / ".spotrelay.toml").write_text(mine)
    shown = _up(tmp_path, monkeypatch)
    assert (tmp_path / ".spotrelay.toml").read_text() == mine
    assert "is your own: left as it is" in shown and "export AWS_ENDPOINT_URL=" in shown
