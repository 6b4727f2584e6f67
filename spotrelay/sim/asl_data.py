"""The job-run ASL's data handling, for ``sim/asl.py``'s interpreter: JSONPath (``$``, ``$.a.b``, ``$$.a.b``),
ResultPath, Parameters templates with the ``States.MathAdd(path, n)`` intrinsic, and Choice rules
(the comparison operators below, And/Or/Not, IsPresent/IsNull). Anything else raises ``AslError``.
Parsed paths and templates are cached: a simulation walks the same few states millions of times."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any

_MATH_ADD = re.compile(r"States\.MathAdd\((\$[\w.]*),\s*(-?\d+)\)")


class AslError(Exception):
    """The ASL uses something this interpreter does not implement."""


# parsed paths and templates: a simulation walks the same few states millions of times
_PATHS: dict[str, tuple[bool, tuple[str, ...] | None]] = {}
_RESULT_PATHS: dict[str, tuple[str, ...]] = {}
_TEMPLATES: dict[int, tuple[dict[str, Any], list[tuple[str, Any, bool]]]] = {}  # id -> (template, its keys)


def _parsed(path: str) -> tuple[bool, tuple[str, ...] | None]:
    """(in the context, the keys; None: the whole document) of a supported path."""
    found = _PATHS.get(path)
    if found is None:
        context, rest = (True, path[1:]) if path.startswith("$$.") else (False, path)
        if rest == "$":
            found = (context, None)
        elif rest.startswith("$."):
            found = (context, tuple(rest[2:].split(".")))
        else:
            raise AslError(f"unsupported path {path!r}")
        _PATHS[path] = found
    return found


def get_path(doc: Any, path: str, context: dict[str, Any] | None = None) -> Any:
    """JSONPath subset: ``$``, ``$.a.b``, and ``$$.a.b`` in ``context``. Missing keys raise KeyError."""
    in_context, parts = _parsed(path)
    if in_context:
        doc = context or {}
    if parts is None:
        return doc
    for part in parts:
        doc = doc[part]
    return doc


def set_path(doc: dict[str, Any], path: str | None, value: Any) -> dict[str, Any]:
    if path is None:
        return doc
    if path == "$":
        return value if isinstance(value, dict) else {"value": value}
    parts = _RESULT_PATHS.get(path)
    if parts is None:
        parts = _RESULT_PATHS[path] = tuple(path[2:].split("."))
    target = doc
    for part in parts[:-1]:
        target = target.setdefault(part, {})
    target[parts[-1]] = value
    return doc


def _keys(template: dict[str, Any]) -> list[tuple[str, Any, bool]]:
    """(output key, value, whether the value is a path) per key; kept per template object."""
    found = _TEMPLATES.get(id(template))
    if found is None or found[0] is not template:  # (the entry holds the template: its id stays its own)
        keys = [(k[:-2], v, True) if k.endswith(".$") else (k, v, False) for k, v in template.items()]
        found = _TEMPLATES[id(template)] = (template, keys)
    return found[1]


def resolve(template: Any, data: Any, context: dict[str, Any], copy_values: bool = False) -> Any:
    """Parameters: ``key.$`` takes the value at a path of the data (``$$.`` of the context)."""
    if isinstance(template, dict):
        out = {}
        for key, value, is_path in _keys(template):
            if is_path and value.startswith("States."):
                out[key] = _intrinsic(value, data, context)
            elif is_path:
                got = get_path(data, value, context)
                out[key] = copy.deepcopy(got) if copy_values else got
            else:
                out[key] = resolve(value, data, context, copy_values)
        return out
    if isinstance(template, list):
        return [resolve(v, data, context, copy_values) for v in template]
    return template


def _intrinsic(call: str, data: Any, context: dict[str, Any]) -> Any:
    """The one intrinsic function the workflow uses: ``States.MathAdd(path, n)`` (an integer sum)."""
    found = _MATH_ADD.fullmatch(call)
    if found is None:
        raise AslError(f"intrinsic {call!r} is not implemented by the simulator")
    value = get_path(data, found.group(1), context)
    if not isinstance(value, int) or isinstance(value, bool):
        raise AslError(f"{call}: {found.group(1)} is {value!r}, not an integer")
    return value + int(found.group(2))


_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "StringEquals": lambda a, b: isinstance(a, str) and a == b,
    "NumericEquals": lambda a, b: isinstance(a, int | float) and a == b,
    "NumericLessThan": lambda a, b: isinstance(a, int | float) and a < b,
    "NumericGreaterThan": lambda a, b: isinstance(a, int | float) and a > b,
    "NumericLessThanEquals": lambda a, b: isinstance(a, int | float) and a <= b,
    "NumericGreaterThanEquals": lambda a, b: isinstance(a, int | float) and a >= b,
    "BooleanEquals": lambda a, b: isinstance(a, bool) and a == b,
}


def choice_matches(rule: dict[str, Any], data: dict[str, Any]) -> bool:
    if "And" in rule:
        return all(choice_matches(r, data) for r in rule["And"])
    if "Or" in rule:
        return any(choice_matches(r, data) for r in rule["Or"])
    if "Not" in rule:
        return not choice_matches(rule["Not"], data)
    try:
        value = get_path(data, rule["Variable"])
        present = True
    except (KeyError, TypeError):
        value, present = None, False
    if "IsPresent" in rule:
        return present is rule["IsPresent"]
    if "IsNull" in rule:
        return present and (value is None) is rule["IsNull"]
    ops = [k for k in rule if k not in ("Variable", "Next")]
    if len(ops) != 1:
        raise AslError(f"choice rule {rule} has no single operator")
    op = ops[0]
    if op.endswith("Path"):
        op, other = op[:-4], get_path(data, rule[ops[0]])
    else:
        other = rule[op]
    if op not in _COMPARE:
        raise AslError(f"choice operator {op} is not implemented by the simulator")
    return present and _COMPARE[op](value, other)
