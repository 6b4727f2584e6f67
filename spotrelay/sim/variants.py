"""spotrelay's variants side by side in one run: ``--variant NAME:SWITCH=VALUE[,SWITCH=VALUE...]``.

A team choosing its spec's settings (an elastic ``min_nodes``, spares, the checkpoint cadence) wants
them on the same markets and seeds as the default and the baselines, in one table: each variant is
one more policy, ``spotrelay:NAME``, the shipped controller with its switches over ``--switch``'s
(runner.make_run), and its cost per useful GPU-hour over spotrelay's, mean of the per-seed ratios,
beside its goodput (report: the line under the table; JSON ``relative[NAME].vs_spotrelay``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from spotrelay.sim.runner import VARIANT_PREFIX, parse_switch

_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,39}")
MAX_VARIANTS = 16  # (each is as many runs as spotrelay: a bigger sweep is a script over the library)
USAGE = "NAME:SWITCH=VALUE[,SWITCH=VALUE...]"


def parse_variant(text: str) -> tuple[str, dict[str, Any]]:
    """``NAME:SWITCH=VALUE,...`` -> (policy name ``spotrelay:NAME``, its switches); ValueError names it."""
    name, sep, rest = text.partition(":")
    name = name.strip()
    if not sep or not _NAME.fullmatch(name):
        raise ValueError(f"--variant {text!r}: expected {USAGE}, NAME of lower-case letters, digits, '.', '_' "
                         f"or '-' (at most 40)")
    switches: dict[str, Any] = {}
    for part in (p for p in rest.split(",") if p.strip()):
        try:
            key, value = parse_switch(part)
        except ValueError as exc:
            raise ValueError(f"--variant {name}: {exc}") from None
        if key in switches:
            raise ValueError(f"--variant {name}: switch {key} given twice")
        switches[key] = value
    if not switches:
        raise ValueError(f"--variant {text!r}: no switch (expected {USAGE})")
    return VARIANT_PREFIX + name, switches


def parse_variants(texts: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Every ``--variant``, in order; a name given twice, or more than ``MAX_VARIANTS``, is refused."""
    if len(texts) > MAX_VARIANTS:
        raise ValueError(f"--variant given {len(texts)} times: at most {MAX_VARIANTS} in one call")
    out: dict[str, dict[str, Any]] = {}
    for text in texts:
        policy, switches = parse_variant(text)
        if policy in out:
            raise ValueError(f"--variant {policy.removeprefix(VARIANT_PREFIX)} given twice")
        out[policy] = switches
    return out


def with_variants(policies: tuple[str, ...], variants: dict[str, dict[str, Any]]) -> tuple[str, ...]:
    """``policies`` with the variants right after spotrelay (first when spotrelay is not among them)."""
    if not variants:
        return policies
    at = policies.index("spotrelay") + 1 if "spotrelay" in policies else 0
    return (*policies[:at], *variants, *policies[at:])
