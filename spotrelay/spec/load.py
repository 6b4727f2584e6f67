"""Load a job spec from YAML or JSON text with errors that name the field path."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from spotrelay.errors import SpecError, SpecFileError, validation_message
from spotrelay.files import read_bounded
from spotrelay.spec.checks import launch_problems
from spotrelay.spec.models import JobSpec
from spotrelay.spec.safe_yaml import load_yaml

MAX_SPEC_BYTES = 256 * 1024
# The validated spec is stored on the job item; DynamoDB refuses items over 400 KB, and the item
# also carries attempts, reasons and tokens.
MAX_STORED_SPEC_BYTES = 160 * 1024
SPEC_SUFFIXES = (".yaml", ".yml", ".json")


def suffix_problem(name: str) -> str | None:
    """Why a file or key of this name is not a spec the controller reads, or None (any case)."""
    if name.lower().endswith(SPEC_SUFFIXES):
        return None
    tail = name.rsplit("/", 1)[-1]
    found = f"'{tail.rsplit('.', 1)[-1]}'" if "." in tail else "no suffix"
    return f"has {found}; a spec is .yaml, .yml or .json"


def _field_path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path or "(root)"


_TYPE_TAGS = {"str", "int", "float", "bool", "none", "list", "dict"}


def _is_tag(part: int | str) -> bool:
    """pydantic puts union member names and validator tags into ``loc``; they are not fields."""
    return isinstance(part, str) and (part in _TYPE_TAGS or "[" in part or part.startswith("function-"))


def _errors(exc: ValidationError) -> list[tuple[str, str]]:
    out = []
    for err in exc.errors():
        loc = tuple(p for p in err["loc"] if not _is_tag(p))
        msg = validation_message(err)
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        out.append((_field_path(loc), msg))
    return out


def first_error(exc: ValidationError) -> tuple[str, str]:
    """(field path, message) of a validation error's first problem, as the spec's errors name them."""
    return (_errors(exc) or [("(root)", str(exc))])[0]


def parse_spec(text: str | bytes, source: str = "<spec>") -> JobSpec:
    """Parse YAML (a superset of JSON) with the bounded loader and validate it; raise ``SpecError``
    naming fields. The one entry point for ``validate``, ``submit``, the handler and the agent."""
    if len(text) > MAX_SPEC_BYTES:
        raise SpecError(source, [("(file)", f"is {len(text)} bytes; the limit is {MAX_SPEC_BYTES}")])
    data: Any = load_yaml(text, source)
    if not isinstance(data, dict):
        raise SpecError(source, [("(root)", "must be a mapping of fields")])
    try:
        spec = JobSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(source, _errors(exc)) from exc
    problems = launch_problems(spec)
    if problems:
        raise SpecError(source, problems)
    stored = len(_canonical(spec))
    if stored > MAX_STORED_SPEC_BYTES:
        raise SpecError(source, [("(file)", f"is {stored} bytes once expanded to JSON; the limit is "
                                            f"{MAX_STORED_SPEC_BYTES} (the job record must fit in DynamoDB)")])
    return spec


def read_spec_file(path: str | Path) -> bytes:
    """A spec file's bytes, at most ``MAX_SPEC_BYTES``: read that far and no further (a link to a
    device or a pipe that never ends is refused, not read for ever)."""
    p = Path(path)
    try:
        size = p.stat().st_size
        if size > MAX_SPEC_BYTES:
            raise SpecFileError(str(p), f"is {size} bytes; the limit is {MAX_SPEC_BYTES}")
        body = read_bounded(p, MAX_SPEC_BYTES)
    except OSError as exc:
        raise SpecFileError(str(p), f"cannot be read: {exc.strerror or exc}") from exc
    if len(body) > MAX_SPEC_BYTES:
        raise SpecFileError(str(p), f"is over the limit of {MAX_SPEC_BYTES} bytes")
    return body


def load_spec(path: str | Path) -> JobSpec:
    return parse_spec(read_spec_file(path), source=str(path))


def _canonical(spec: JobSpec) -> bytes:
    return json.dumps(spec.model_dump(mode="json"), sort_keys=True, separators=(",", ":")).encode()


def spec_hash(spec: JobSpec) -> str:
    """A stable hash of the spec's content (key order and formatting do not matter)."""
    return hashlib.sha256(_canonical(spec)).hexdigest()


# What defines the training a checkpoint belongs to: the program, its arguments and environment, the
# launcher and its DeepSpeed config, the dataset. Not: where and how it runs (resources, recovery),
# how it is saved (cadence, retention, tiers), who is told and what it may cost (tracking,
# notifications, budget), health policy, the name, or the code's location (the trainer's code hash
# covers the script: a code fix is normal). Raising a budget or adding a region and resubmitting
# resumes; changing the learning rate does not without the opt-in.
_TRAINING_FIELDS: dict[str, bool | set[str]] = {
    "version": True, "entrypoint": {"command", "script", "args", "working_dir", "env"}, "launcher": True,
    "dataset": {"uri"}}


def training_differences(a: JobSpec, b: JobSpec) -> list[str]:
    """The fields of the training definition (``_TRAINING_FIELDS``) in which ``a`` and ``b`` differ."""
    left, right = (s.model_dump(mode="json", include=_TRAINING_FIELDS) for s in (a, b))
    out = []
    for key in sorted(set(left) | set(right)):
        x, y = left.get(key), right.get(key)
        if isinstance(x, dict) and isinstance(y, dict):
            out += [f"{key}.{k}" for k in sorted(set(x) | set(y)) if x.get(k) != y.get(k)]
        elif x != y:
            out.append(key)
    return out


def training_hash(spec: JobSpec) -> str:
    """A stable hash of the spec's training definition (``_TRAINING_FIELDS``): what a checkpoint's
    manifest records, and a resume under another one is refused unless allowed."""
    doc = spec.model_dump(mode="json", include=_TRAINING_FIELDS)
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
