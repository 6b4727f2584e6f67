"""The CDK app's pure helpers, without a synth: context, ASL substitution, staging, nag rendering."""

from __future__ import annotations

import pytest

from cdk import nag, staging
from cdk.config import AppConfig, InfraConfigError, from_context
from cdk.workflow import placeholders, render, substitutions


def test_context_strings_from_the_cli_are_parsed() -> None:
    ctx = {"training_regions": "us-east-1, eu-west-1", "fsx_enabled": "true", "alarm_email": ""}
    config = from_context(ctx.get)
    assert config.training_regions == ("us-east-1", "eu-west-1")
    assert config.fsx_enabled is True and config.alarm_email is None
    assert from_context({"training_regions": '["us-west-2"]'}.get).training_regions == ("us-west-2",)


@pytest.mark.parametrize(
    "bad",
    [
        {"training_regions": "a-b-1,us-east-1,us-east-2,us-west-2,eu-west-1"},  # five regions
        {"training_regions": "us-east-1,us-east-1"},
        {"log_retention_days": 31},
        {"fsx_storage_gib": 2000},
        {"prefix": "Bad_Prefix"},
    ],
)
def test_invalid_context_fails_with_a_clear_error(bad: dict[str, object]) -> None:
    with pytest.raises(InfraConfigError, match="invalid CDK context"):
        from_context(bad.get)


def test_defaults_are_four_regions_and_fsx_off() -> None:
    config = AppConfig()
    assert len(config.training_regions) == 4 and config.fsx_enabled is False


class _Fn:
    def __init__(self, arn: str) -> None:
        self.function_arn = arn


def test_every_placeholder_gets_a_value_or_synth_names_the_missing_ones() -> None:
    asl = '{"A": {"Resource": "${fn_sfn_plan}"}, "B": {"TopicArn": "${TopicArn}"}, "C": "${fn_gone}"}'
    assert placeholders(asl) == ["TopicArn", "fn_gone", "fn_sfn_plan"]
    functions = {"sfn_plan": _Fn("arn:plan")}
    with pytest.raises(InfraConfigError, match=r"\$\{fn_gone\}"):
        substitutions(asl, functions, {"TopicArn": "arn:topic"})  # type: ignore[arg-type]
    values = substitutions(asl.replace("${fn_gone}", "x"), functions, {"TopicArn": "arn:topic"})  # type: ignore[arg-type]
    assert render(asl.replace("${fn_gone}", "x"), values) == (
        '{"A": {"Resource": "arn:plan"}, "B": {"TopicArn": "arn:topic"}, "C": "x"}'
    )


def test_handlers_are_discovered_by_convention(tmp_path: object) -> None:
    from pathlib import Path

    root = Path(str(tmp_path))
    (root / "on_thing.py").write_text("def handler(event, context):\n    return 1\n")
    (root / "_helpers.py").write_text("def handler(event, context):\n    return 1\n")
    (root / "not_a_handler.py").write_text("def other():\n    pass\n")
    (root / "aliased.py").write_text("from x import y\nhandler = y\n")
    assert staging.discover_handlers(root) == ["aliased", "on_thing"]


def test_layer_takes_dependencies_and_refuses_torch() -> None:
    names = {d.metadata["Name"].lower().replace("_", "-") for d in staging.layer_distributions()}
    assert {"pydantic", "pydantic-core", "pyyaml", "aws-lambda-powertools"} <= names
    assert not names & {"boto3", "botocore", "torch"}
    with pytest.raises(RuntimeError, match="never enter the Lambda layer"):
        staging.layer_distributions(["torch"])


def test_nag_rendering_matches_cdk_nag_and_reasons_only_for_known_wildcards() -> None:
    ref = {"Fn::Join": ["", [{"Fn::GetAtt": ["Bucket12", "Arn"]}, "/checkpoints/*"]]}
    assert nag.flatten(ref) == "<Bucket12.Arn>/checkpoints/*"
    assert nag.flatten({"Fn::Join": ["", ["arn:", {"Ref": "AWS::Partition"}, ":s3:::b/*"]]}) == (
        "arn:<AWS::Partition>:s3:::b/*"
    )
    doc = {
        "Statement": [
            {"Effect": "Allow", "Action": ["s3:GetObject*"], "Resource": [ref]},
            {"Effect": "Deny", "Action": "s3:*", "Resource": "*"},
        ]
    }
    assert nag.wildcard_findings(doc) == ["Action::s3:GetObject*", "Resource::<Bucket12.Arn>/checkpoints/*"]
    assert nag.reason_for("Resource::<Bucket12.Arn>/checkpoints/*")
    star = {"Statement": [{"Effect": "Allow", "Action": ["xray:PutTraceSegments"], "Resource": "*"}]}
    assert nag.reason_for("Resource::*", star)
    star["Statement"].append({"Effect": "Allow", "Action": ["s3:GetObject"], "Resource": "*"})
    assert nag.reason_for("Resource::*", star) is None  # s3 on "*" is never explained
    assert nag.reason_for("Action::dynamodb:*") is None


# What the Lambda Python runtime ships besides the standard library.
_RUNTIME_MODULES = ("boto3", "botocore", "s3transfer", "jmespath", "dateutil", "six", "urllib3")


def test_every_handler_imports_with_only_the_layer_and_the_lambda_runtime(tmp_path: object) -> None:
    """A handler that imports torch, mlflow or typer at module level would fail in Lambda."""
    import importlib.util
    import os
    import subprocess
    import sys
    from pathlib import Path

    runtime = Path(str(tmp_path)) / "runtime"
    runtime.mkdir()
    for name in _RUNTIME_MODULES:
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None
        origin = Path(spec.origin)
        source = origin.parent if origin.name == "__init__.py" else origin
        (runtime / source.name).symlink_to(source)
    handlers = staging.stage_handlers(out=Path(str(tmp_path)) / "handlers")
    layer = staging.BUILD / "layer" / "python"
    if not layer.exists():
        staging.stage_layer()
    modules = staging.discover_handlers()
    code = (
        "import importlib, sys\n"
        + "".join(f"importlib.import_module('functions.{m}')\n" for m in modules)
        + (
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
            "{'torch', 'deepspeed', 'mlflow', 'numpy', 'typer', 'rich', 'agent', 'cdk', 'aws_cdk'})\n"
            "assert not bad, bad\n"
        )
    )
    env = {
        "PYTHONPATH": os.pathsep.join(map(str, (handlers, layer, runtime))),
        "AWS_DEFAULT_REGION": "us-east-1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "POWERTOOLS_TRACE_DISABLED": "true",
    }
    # -S: no site-packages, so nothing from .venv leaks in
    result = subprocess.run([sys.executable, "-S", "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]


def test_every_context_key_is_in_cdk_json_and_documented() -> None:
    import json
    from pathlib import Path

    from cdk.config import CONTEXT_KEYS

    root = Path(__file__).resolve().parents[2]
    context = json.loads((root / "cdk.json").read_text())["context"]
    doc = (root / "docs" / "deploy.md").read_text()
    for key in CONTEXT_KEYS:
        assert key in context, f"cdk.json lacks {key}"
        assert f"| `{key}` |" in doc, f"docs/deploy.md does not document {key}"
    assert from_context(context.get) == AppConfig(**{k: v for k, v in context.items() if k in CONTEXT_KEYS and v != ""})


def test_availability_zones_must_belong_to_their_region() -> None:
    assert from_context({"availability_zones": '{"us-west-2": ["us-west-2a"]}'}.get).availability_zones == {
        "us-west-2": ("us-west-2a",)
    }
    with pytest.raises(InfraConfigError, match="availability_zones"):
        from_context({"availability_zones": {"us-west-2": ["us-east-1a"]}}.get)
