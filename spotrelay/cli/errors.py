"""One place where every CLI command's failure becomes one line and an exit code.

``SpotrelayGroup`` is the Typer group class of the app (and so of every command and sub-app added
to it, now or later): it runs the command and turns what escapes into ``error: <cause>; <what to
do>`` on stderr. Exit codes: 2 for usage and configuration (bad flags, unreadable or invalid
files), 1 for runtime failures (AWS, the twin, a job that cannot do what was asked). A traceback
is a bug: ``SPOTRELAY_DEBUG=1`` shows it for a report.
"""

from __future__ import annotations

import os
import select
import sys
from pathlib import Path
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from typer import _click as click  # typer vendors click: its exceptions, not the click package's
from typer.core import TyperGroup

from spotrelay.errors import RemoteBug, SpecError, SpecFileError, SpotrelayError

err = Console(stderr=True)
USAGE, RUNTIME = 2, 1


class UsageProblem(SpotrelayError):
    """A problem with what the user typed or pointed at (exit 2)."""


def check_writable(path: Path, option: str) -> None:
    """A usage problem naming ``option`` unless ``path`` can take an output file, checked before a
    command's work so a mistyped path does not throw it away. Nothing that exists is changed and
    nothing is left behind but the parent folders."""
    try:
        if path.is_dir():  # (inside: a name too long for the system raises here)
            raise UsageProblem(f"{option} {path}: is a directory")
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() and not path.is_file():  # a pipe or a device: not opened (a pipe's open waits for a reader)
            if not os.access(path, os.W_OK):
                raise UsageProblem(f"{option} {path}: cannot be written (permission denied)")
        elif path.exists():
            with path.open("a"):
                pass
        else:
            path.touch()
            path.unlink()
    except OSError as exc:
        raise UsageProblem(f"{option} {path}: cannot be written ({exc.strerror or exc})") from exc


def check_folder(path: Path, option: str) -> None:
    """A usage problem naming ``option`` unless ``path`` is, or can be made, a folder to write in (a file
    there, or above it, is named as one: mkdir's bare "File exists" named no reason)."""
    blocker = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        where = "" if blocker == path else f"{blocker} "
        raise UsageProblem(f"{option} {path}: {where}is a file, not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageProblem(f"{option} {path}: cannot be created ({exc.strerror or exc})") from exc
    if not os.access(path, os.W_OK | os.X_OK):
        raise UsageProblem(f"{option} {path}: cannot be written (permission denied)")


def explain(exc: BaseException) -> tuple[str, int]:
    """(one line, exit code) for anything a command let escape."""
    from spotrelay.adapters.aws_errors import explain as explain_aws

    aws = explain_aws(exc, os.environ.get("AWS_ENDPOINT_URL"))
    if aws is not None:
        return aws
    if isinstance(exc, UsageProblem):
        return str(exc), USAGE
    if isinstance(exc, SpecFileError):  # the file, not a field: its name and the cause
        return f"{printable(exc.source)}: {exc.cause}", USAGE
    if isinstance(exc, SpotrelayError):
        return str(exc), RUNTIME
    if isinstance(exc, (OSError, UnicodeDecodeError)) and not _network(exc):
        name = getattr(exc, "filename", None)
        what = f"{name}: " if name else ""
        return f"{what}{getattr(exc, 'strerror', None) or exc}", USAGE
    if _network(exc):
        return f"cannot connect: {exc}; is the endpoint (or the twin) running?", RUNTIME
    if isinstance(exc, ValueError):
        return str(exc), USAGE
    kind = exc.kind if isinstance(exc, RemoteBug) else type(exc).__name__  # (a worker's: named as its own)
    return f"unexpected {kind}: {exc} (a bug: rerun with SPOTRELAY_DEBUG=1 and report it)", RUNTIME


def _network(exc: BaseException) -> bool:
    return isinstance(exc, ConnectionError) or type(exc).__module__.startswith(("requests", "urllib3"))


def printable(name: str) -> str:
    """A file's name with its control characters escaped: a newline in it broke a line in two."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in name)


def print_spec_error(exc: SpecError) -> None:
    """Spec errors list every field, one per line, under the file's name."""
    # the file's name whole on its line (not wrapped at the terminal's width) and as written ([ ] kept)
    out = _err()
    out.print(f"[red]invalid spec[/] {escape(printable(str(exc.source)))}", highlight=False, soft_wrap=True)
    for path, msg in exc.errors:
        out.print(f"  {path}: {msg}", highlight=False, markup=False, soft_wrap=True)


def usage_line(exc: click.exceptions.UsageError) -> str:
    """Click's usage error as one line: the cause and where the help is, without the usage box."""
    msg = " ".join(exc.format_message().split()).replace("Value error, ", "")  # (pydantic's, of a parser)
    msg = msg[:1].lower() + msg[1:]
    if not msg.endswith((".", "?")):
        msg += "."
    path = exc.ctx.command_path if exc.ctx is not None else "spotrelay"
    return f"error: {msg} Try '{path} --help'."


def _usage_exit(exc: click.exceptions.UsageError) -> typer.Exit:
    err.print(usage_line(exc), highlight=False, markup=False, soft_wrap=True)
    return typer.Exit(USAGE)


class SpotrelayGroup(TyperGroup):
    # Parsing happens in make_context (this group's own options) and inside invoke (the subcommand's
    # name, then its arguments): both are wrapped so a usage error anywhere in the tree is one line.
    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: Any) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.exceptions.NoArgsIsHelpError:  # bare `spotrelay` / `spotrelay local`: the help
            raise
        except click.exceptions.UsageError as exc:
            raise _usage_exit(exc) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.exceptions.UsageError as exc:
            raise _usage_exit(exc) from None
        except (typer.Exit, typer.Abort, click.ClickException):
            raise
        except KeyboardInterrupt:
            _err().print("interrupted")
            raise typer.Exit(130) from None
        except SpecFileError as exc:  # unreadable, not invalid: one line, as any other file's
            raise_one_line(exc)
        except SpecError as exc:
            print_spec_error(exc)
            raise typer.Exit(USAGE) from None
        except BrokenPipeError as exc:
            if _stdout_closed():  # `spotrelay ... | head`: click's main exits 1 quietly for a closed stdout
                raise
            raise_one_line(exc)
        except Exception as exc:
            raise_one_line(exc)


def _err() -> Console:
    """Where an error line goes: stderr, or the terminal's once a twin's logs took fd 2 (twinlog.quiet_logs:
    the demo, `local up`, `local chaos`), so that a failure mid-run is not written only to twin.log."""
    from spotrelay.local.twinlog import terminal_err

    stream = terminal_err()
    # only while sys.stderr is the process's own (fd 2: the log); a capture (a test's CliRunner) gets it
    return Console(file=stream) if stream is not None and sys.stderr is sys.__stderr__ else err


def raise_one_line(exc: BaseException) -> NoReturn:
    """Print ``exc`` as one line and exit with its code (re-raised as is with SPOTRELAY_DEBUG)."""
    if os.environ.get("SPOTRELAY_DEBUG"):
        raise exc
    line, code = explain(exc)
    _err().print(f"error: {' '.join(line.split())}", highlight=False, markup=False, soft_wrap=True)
    raise typer.Exit(code) from None


def _stdout_closed() -> bool:
    """Whether standard output is a pipe whose reader has gone (a BrokenPipeError from a socket is a
    network failure instead): the write end of such a pipe polls as an error."""
    try:
        fd = sys.stdout.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        return any(ev & select.POLLERR for _, ev in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no real stdout (a test runner's buffer): not a pipe
        return False

