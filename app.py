#!/usr/bin/env python3
"""The spotrelay CDK app: ``python app.py`` (or ``cdk synth``) synthesizes every stack into cdk.out.

Context keys (cdk.json, ``-c key=value``) are documented in docs/deploy.md. The synth is offline: no
lookups, the account stays a deploy-time value, AMIs resolve from SSM at deploy time. cdk-nag
(AwsSolutions) runs as a validation plugin: an unacknowledged finding fails the synth.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from aws_cdk import App

from cdk.app_builder import build
from cdk.config import InfraConfigError

ROOT = Path(__file__).resolve().parent


def default_context() -> dict[str, Any]:
    """cdk.json's context, so ``python app.py`` and ``cdk synth`` see the same defaults
    (the CLI's ``-c`` values are applied on top by CDK)."""
    context: dict[str, Any] = json.loads((ROOT / "cdk.json").read_text()).get("context", {})
    return {key: value for key, value in context.items() if not key.startswith("//")}


def make_app(
    outdir: str | None = None, context: dict[str, Any] | None = None, handlers: list[str] | None = None
) -> App:
    # the CLI passes CDK_OUTDIR; ``python app.py`` writes ./cdk.out like ``cdk synth`` would
    outdir = outdir or os.environ.get("CDK_OUTDIR") or str(ROOT / "cdk.out")
    app = App(outdir=outdir, context={**default_context(), **(context or {})})
    build(app, handlers=handlers)
    return app


def main() -> int:
    try:
        app = make_app()
    except InfraConfigError as exc:
        print(f"spotrelay: cannot synthesize: {exc}", file=sys.stderr)
        return 2
    app.synth()
    return 0


if __name__ == "__main__":
    sys.exit(main())
