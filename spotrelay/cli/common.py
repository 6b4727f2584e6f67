"""What the CLI's command modules share: the AWS options, connecting to AWS (or the twin), the spec
file's suffix check and the submission key a spec is uploaded under."""

from __future__ import annotations

import math
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from spotrelay.cli import config
from spotrelay.cli.errors import UsageProblem

EndpointOpt = Annotated[str | None, typer.Option("--endpoint-url", help="AWS endpoint (the local twin)")]
BucketOpt = Annotated[str | None, typer.Option("--bucket", help="jobs bucket")]
TableOpt = Annotated[str | None, typer.Option("--table", help="jobs table")]
RegionOpt = Annotated[str | None, typer.Option("--region", help="home region")]
JsonOpt = Annotated[bool, typer.Option("--json", help="machine-readable output")]
MAX_JOB_ID = 200  # job_id_for makes at most 53 characters; DynamoDB refuses a key past 2,048 bytes
CLI_AWS_ATTEMPTS = "3"  # a person is waiting: fail in seconds, not a minute of backoff


def number(low: float, high: float, *, above: bool = False) -> Callable[[str], float]:
    """A float option's parser: a finite number from ``low`` (excluded when ``above``) to ``high``, or a
    ValueError that says so with the value typed. (Typer's own ``min``/``max`` let NaN through to a
    misleading reason, "should be less than or equal to", and an option without them takes NaN as is.)"""
    bounds = f"above {low:g} and at most {high:g}" if above else f"from {low:g} to {high:g}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"{text!r} is not a number") from None
        if not math.isfinite(value) or value > high or value < low or (above and value == low):
            raise ValueError(f"{text} is not a number {bounds}")
        return value

    return parse


def job_id(text: str) -> str:
    """The JOB argument's parser: an id as `spotrelay jobs` lists it, or a ValueError (a usage error naming
    JOB) before any AWS call (an empty key was DynamoDB's ValidationException, read as a runtime failure)."""
    if not text.strip():
        raise ValueError("empty; give a job id as `spotrelay jobs` lists it")
    if text != text.strip() or any(not c.isprintable() for c in text) or len(text) > MAX_JOB_ID:
        shown = text if len(text) <= 60 else text[:57] + "..."
        raise ValueError(f"{shown!r} is not a job id; ids look like 'train-0123456789ab' "
                         "(`spotrelay jobs` lists them)")
    return text


def given_path(text: str | Path) -> Path:
    """A file option's parser: an empty or blank value (an unset shell variable) is a usage error naming
    the option; as a Path it was ".", the current folder, and was read or refused as that."""
    if isinstance(text, Path):  # an option's default (click parses it too), not what was typed
        return text
    if not text.strip():
        raise ValueError(f"{text!r} names no file")
    return Path(text)


def output_path(text: str) -> Path:
    """An output file option's parser: ``given_path``, and a value ending in a slash is a usage error (it
    names a folder; Path drops the slash, and the file was written beside it as the name without one)."""
    path = given_path(text)
    if text.endswith(("/", os.sep)):
        raise ValueError(f"{text!r} ends in a slash: it names a folder, not the file to write")
    return path


JobArg = Annotated[str, typer.Argument(metavar="JOB", parser=job_id, help="the job's id (`spotrelay jobs`)")]
SpecArg = Annotated[Path, typer.Argument(metavar="FILE", parser=given_path, help="the job spec (.yaml, .yml or .json)")]


def number_option(low: float, high: float, *, above: bool = False) -> dict[str, Any]:
    """``typer.Option`` arguments of a float option: ``number``'s parser, and its range where the help
    shows the type (a parser hides Typer's own range box)."""
    return {"parser": number(low, high, above=above), "metavar": f"{'>' if above else ''}{low:g}..{high:g}"}


def connect(endpoint: str | None, bucket: str | None, table: str | None, region: str | None) -> None:
    """Point the settings at AWS (or the twin): flags, then the environment, then the config file."""
    try:
        config.apply({"endpoint_url": endpoint, "bucket": bucket, "jobs_table": table, "region": region})
    except ValueError as exc:
        raise UsageProblem(str(exc)) from exc
    os.environ.setdefault("SPOTRELAY_AWS_MAX_ATTEMPTS", CLI_AWS_ATTEMPTS)


def check_spec_suffix(file: Path) -> None:
    """Refuse a spec the controller would not read (its suffix), before anything is uploaded."""
    from spotrelay.spec.load import suffix_problem

    problem = suffix_problem(file.name)
    if problem is not None:
        raise UsageProblem(f"{file}: {problem}; rename it (the controller reads only those)")


def submission_key(name: str, suffix: str, now: float) -> str:
    """A key the controller reads (lower-case spec suffix), unique per upload: two submits, two jobs."""
    from spotrelay.resources import RESOURCES

    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now))
    return f"{RESOURCES.submissions_prefix}{name}-{stamp}-{uuid.uuid4().hex[:8]}{suffix.lower()}"
