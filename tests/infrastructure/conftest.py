"""ONE synth of the real app (app.make_app) shared by every infrastructure test.

The context turns on the optional parts (FSx, alarm e-mail, dataset buckets) so that cdk-nag and cfn-lint
see them too.
A cdk-nag failure does not stop the fixture: the templates and the validation report are still
written, and test_checks.py reports the findings by name.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

CONTEXT = {
    "fsx_enabled": True,
    "alarm_email": "ml-platform@example.com",
    "prefix": "spotrelay",
    "availability_zones": {"us-west-2": ["us-west-2a", "us-west-2b", "us-west-2c"]},
    "dataset_buckets": ["acme-ml-data", "acme-ml-data-usw2"],
}


@dataclass
class Synth:
    outdir: Path
    templates: dict[str, dict[str, Any]]  # stack name -> template
    regions: dict[str, str]  # stack name -> region
    home: str  # home stack name
    training: dict[str, str]  # region -> stack name
    report: dict[str, Any] | None
    error: str | None
    config: Any
    stacks: dict[str, Any] = field(default_factory=dict)

    def template(self, stack: str) -> dict[str, Any]:
        return self.templates[stack]

    def resources(self, stack: str, type_: str) -> dict[str, dict[str, Any]]:
        return {k: v for k, v in self.templates[stack]["Resources"].items() if v["Type"] == type_}


@pytest.fixture(scope="session")
def synth(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Synth]:
    import app as app_module
    from cdk.app_builder import home_stack_name, training_stack_name
    from cdk.config import from_context

    outdir = tmp_path_factory.mktemp("cdk.out")
    cdk_app = app_module.make_app(outdir=str(outdir), context=CONTEXT)
    error = None
    try:
        cdk_app.synth()
    except RuntimeError as exc:  # cdk-nag findings: the report below names them
        error = str(exc)
    config = from_context(cdk_app.node.try_get_context)
    manifest = json.loads((outdir / "manifest.json").read_text())
    templates, regions = {}, {}
    for name, artifact in manifest["artifacts"].items():
        if artifact["type"] != "aws:cloudformation:stack":
            continue
        templates[name] = json.loads((outdir / artifact["properties"]["templateFile"]).read_text())
        regions[name] = artifact["environment"].rsplit("/", 1)[-1]
    report_path = outdir / "policy-validation-report.json"
    report = json.loads(report_path.read_text()) if report_path.exists() else None
    stacks = {child.node.id: child for child in cdk_app.node.children}
    yield Synth(
        outdir=outdir,
        templates=templates,
        regions=regions,
        home=home_stack_name(config),
        training={r: training_stack_name(config, r) for r in config.training_regions},
        report=report,
        error=error,
        config=config,
        stacks=stacks,
    )
