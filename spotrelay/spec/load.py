"""Load a job spec from YAML or JSON text with errors that name the field path."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from spotrelay.errors import SpecError
from spotrelay.spec.models import JobSpec

MAX_SPEC_BYTES = 256 * 1024


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
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        out.append((_field_path(loc), msg))
    return out


def parse_spec(text: str | bytes, source: str = "<spec>") -> JobSpec:
    """Parse YAML (a superset of JSON) safely and validate it; raise ``SpecError`` naming fields."""
    if len(text) > MAX_SPEC_BYTES:
        raise SpecError(source, [("(file)", f"is {len(text)} bytes; the limit is {MAX_SPEC_BYTES}")])
    try:
        data: Any = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SpecError(source, [("(file)", f"is not valid YAML or JSON{where}")]) from exc
    if not isinstance(data, dict):
        raise SpecError(source, [("(root)", "must be a mapping of fields")])
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(source, _errors(exc)) from exc


def load_spec(path: str | Path) -> JobSpec:
    p = Path(path)
    try:
        size = p.stat().st_size
    except OSError as exc:
        raise SpecError(str(p), [("(file)", f"cannot be read: {exc.strerror}")]) from exc
    if size > MAX_SPEC_BYTES:
        raise SpecError(str(p), [("(file)", f"is {size} bytes; the limit is {MAX_SPEC_BYTES}")])
    return parse_spec(p.read_bytes(), source=str(p))


def spec_hash(spec: JobSpec) -> str:
    """A stable hash of the spec's content (key order and formatting do not matter)."""
    canonical = json.dumps(spec.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()
