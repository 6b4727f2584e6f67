"""Job spec validation: the shipped examples pass, bad specs fail naming the field."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
import yaml

from spotrelay.errors import SpecError
from spotrelay.spec import JobSpec, load_spec, parse_spec, spec_hash, training_hash
from tests.conftest import ROOT

HANG_S = 300.0  # a wait's bound that only catches a hang (a loaded CI machine may be slow, never this slow)

EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
MINIMAL = {
    "version": 1,
    "name": "ok",
    "entrypoint": {"script": "train.py"},
    "resources": {"nodes": 2},
    "checkpoint": {"every_steps": 100},
}


def _errors(data: object) -> dict[str, str]:
    with pytest.raises(SpecError) as info:
        parse_spec(json.dumps(data))
    return dict(info.value.errors)


def _with(path: str, value: object) -> dict[str, object]:
    data = json.loads(json.dumps(MINIMAL))
    node = data
    parts = path.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return data


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_are_valid(path: Path) -> None:
    spec = load_spec(path)
    assert isinstance(spec, JobSpec)


def test_three_examples_ship() -> None:
    assert len(EXAMPLES) >= 3


def test_minimal_defaults() -> None:
    spec = parse_spec(json.dumps(MINIMAL))
    assert spec.resources.instance_types == ["p5.48xlarge", "p4d.24xlarge"]
    assert [m.value for m in spec.resources.markets] == ["spot", "on-demand"]
    assert spec.recovery.strategy == "replace-lost-nodes" and spec.recovery.launch_at_notice
    assert spec.resources.spares == 0 and not spec.recovery.prewarm_on_rebalance


@pytest.mark.parametrize(
    ("path", "value", "field", "needle"),
    [
        ("resources.nodes", 0, "resources.nodes", "greater than or equal to 1"),
        ("resources.regions", ["us-east-1", "moon-1"], "resources.regions", "not an AWS region"),
        ("resources.regions", ["us-east-1", "us-east-2", "us-west-1", "us-west-2", "eu-west-1"],
         "resources.regions", "at most 4"),
        ("resources.markets", ["spot", "reserved"], "resources.markets[1]", "spot"),
        ("resources.instance_types", ["p5"], "resources.instance_types", "not an EC2 instance type"),
        ("resources.max_hourly_price", -1, "resources.max_hourly_price", "greater than 0"),
        ("launcher.type", "mpirun", "launcher.type", "torchrun"),
        ("checkpoint", {"every_minutes": "hourly"}, "checkpoint.every_minutes", "or 'auto'"),
        ("checkpoint", {"every_minutes": "auto", "auto_min_minutes": 90}, "checkpoint",
         "auto_min_minutes is above auto_max_minutes"),
        ("recovery.strategy", "pray", "recovery.strategy", "replace-cluster"),
        ("recovery.retry_exit_codes", [0], "recovery.retry_exit_codes", "outside 1..255"),
        ("dataset", {"uri": "http://x"}, "dataset.uri", "pattern"),
        ("entrypoint", {"script": "a.py", "command": ["b"]}, "entrypoint", "exactly one"),
        ("entrypoint.env", {"1BAD": "x"}, "entrypoint.env", "not a valid environment variable"),
        ("name", "has spaces", "name", "pattern"),
        ("version", 2, "version", "1"),
        ("notifications.sns_topic_arn", "topic", "notifications.sns_topic_arn", "pattern"),
        ("budget.warn_at", 1.0, "budget.warn_at", "less than 1"),
        ("budget.warn_at", 0, "budget.warn_at", "greater than 0"),
    ],
)
def test_bad_fields_are_named(path: str, value: object, field: str, needle: str) -> None:
    errors = _errors(_with(path, value))
    assert field in errors, errors
    assert needle in errors[field]


def test_unknown_fields_are_errors_at_any_depth() -> None:
    data = _with("resources.gpu_type", "h100")
    data["extra_top"] = True
    errors = _errors(data)
    assert errors["resources.gpu_type"] == "unknown field"
    assert errors["extra_top"] == "unknown field"


def test_deepspeed_launcher_needs_a_config() -> None:
    errors = _errors(_with("launcher", {"type": "deepspeed"}))
    assert "deepspeed_config" in errors["launcher"]


def test_missing_required_fields() -> None:
    errors = _errors({"version": 1})
    assert {"name", "entrypoint", "resources", "checkpoint"} <= set(errors)


@pytest.mark.parametrize("text", ["a: [1", "- 1\n- 2", "just a string", ""])
def test_not_a_mapping_or_not_yaml(text: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(text, source="job.yaml")
    assert str(info.value).startswith("job.yaml:")


def test_yaml_python_tags_are_refused() -> None:
    with pytest.raises(SpecError):
        parse_spec("!!python/object/apply:os.system ['echo pwned']")


def test_oversized_file(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text("#" + "x" * (300 * 1024))
    with pytest.raises(SpecError, match="limit"):
        load_spec(big)


def _refused_without_hanging(path: Path, hung: str) -> list[BaseException]:
    """``load_spec(path)`` in a thread: what it raised, or a failure (not a hang) when it has not
    answered after HANG_S (only catches a hang: a bounded read takes milliseconds)."""
    refused: list[BaseException] = []

    def load() -> None:
        try:
            load_spec(path)
        except BaseException as exc:  # (any answer: the test judges it)
            refused.append(exc)

    reader = threading.Thread(target=load, daemon=True)
    reader.start()
    reader.join(HANG_S)
    assert refused, f"load_spec {hung} after {HANG_S:.0f} s"
    return refused


def test_a_spec_path_that_never_ends_is_refused_not_read_for_ever(tmp_path: Path) -> None:
    """A link to /dev/zero reports size 0: the read itself stops at the limit."""
    endless = tmp_path / "job.yaml"
    endless.symlink_to("/dev/zero")
    refused = _refused_without_hanging(endless, "still reading /dev/zero")
    assert isinstance(refused[0], SpecError) and "over the limit" in str(refused[0])
    assert refused[0].source == str(endless)


def test_a_spec_path_that_is_a_pipe_nothing_writes_to_is_refused_not_waited_on(tmp_path: Path) -> None:
    """open() of a FIFO waits for a writer: `spotrelay validate PIPE` (and submit, simulate --spec) hung."""
    pipe = tmp_path / "job.yaml"
    os.mkfifo(pipe)
    refused = _refused_without_hanging(pipe, "still waiting on a pipe")
    assert isinstance(refused[0], SpecError) and "is empty" in str(refused[0]) and refused[0].source == str(pipe)


def test_missing_file_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"nope\.yaml"):
        load_spec(tmp_path / "nope.yaml")


def test_hash_ignores_formatting_but_not_content() -> None:
    a = parse_spec(json.dumps(MINIMAL))
    b = parse_spec(yaml.safe_dump(MINIMAL, sort_keys=False))
    assert spec_hash(a) == spec_hash(b)
    assert spec_hash(a) != spec_hash(parse_spec(json.dumps(_with("resources.nodes", 3))))


@pytest.mark.parametrize(("path", "value"), [
    ("budget.max_total_cost", 900), ("notifications.slack_channel", "#runs"), ("resources.nodes", 3),
    ("resources.regions", ["us-east-1", "us-west-2"]), ("recovery.max_user_restarts", 2),
    ("checkpoint.every_minutes", 10), ("tracking.mlflow_experiment", "x"), ("name", "renamed"),
    ("entrypoint.code", "s3://acme-code/train.tar.gz"), ("health.enabled", False)])
def test_the_training_hash_ignores_how_and_where_it_runs(path: str, value: object) -> None:
    """What a checkpoint is checked against on resume: raising a budget or adding a region keeps it."""
    base = parse_spec(json.dumps(MINIMAL))
    changed = parse_spec(json.dumps(_with(path, value)))
    assert spec_hash(changed) != spec_hash(base)
    assert training_hash(changed) == training_hash(base)


@pytest.mark.parametrize(("path", "value"), [
    ("entrypoint.args", ["--lr", "3e-4"]), ("entrypoint.env", {"LR": "1"}), ("entrypoint.script", "other.py"),
    ("launcher", {"type": "deepspeed", "deepspeed_config": {"train_micro_batch_size_per_gpu": 2}}),
    ("dataset", {"uri": "s3://data/v2/"})])
def test_the_training_hash_follows_the_training_definition(path: str, value: object) -> None:
    assert training_hash(parse_spec(json.dumps(_with(path, value)))) != training_hash(parse_spec(json.dumps(MINIMAL)))


@pytest.mark.parametrize(("field", "value"), [
    ("warmup_steps", "yes"), ("max_rollbacks", "no"), ("straggler_checks", "true"), ("hang_after_s", "on")])
def test_a_boolean_is_no_number_in_the_health_section_either(field: str, value: str) -> None:
    """`warmup_steps: yes` was read as 1 and `max_rollbacks: no` as 0 (job-spec.md: a number is a number)."""
    with pytest.raises(SpecError) as info:
        parse_spec(yaml.safe_dump(MINIMAL) + f"health:\n  {field}: {value}\n")
    assert dict(info.value.errors)[f"health.{field}"].startswith("expected a number, got ")



def test_a_health_bound_the_nodes_could_not_read_back_is_refused() -> None:
    """`straggler_min_s: .inf` validated, then went to the ranks as null (JSON has no infinity): every
    rank's SPOTRELAY_HEALTH failed to load, after the gang was paid for."""
    with pytest.raises(SpecError) as info:
        parse_spec(yaml.safe_dump(MINIMAL) + "health:\n  straggler_min_s: .inf\n")
    assert "finite" in dict(info.value.errors)["health.straggler_min_s"]


def test_validate_refuses_a_place_the_nodes_policy_would_read_as_a_pattern(tmp_path: Path) -> None:
    """`*`, `?` and `$` in dataset.uri, a replica or checkpoint.s3_prefix: IAM reads a pattern (other jobs'
    data or checkpoints). Only the submission handler refused them, with the deployment's buckets; the check
    needs none, so `spotrelay validate` says it too, in the handler's words."""
    from typer.testing import CliRunner

    from spotrelay.cli.main import app
    from spotrelay.spec.checks import checkpoint_place_problems, dataset_place_problems

    doc = _with("dataset", {"uri": "s3://data/corpus/*/", "replicas": {"us-west-2": "s3://data-usw2/c?/"}})
    doc["checkpoint"] = {"every_steps": 100, "s3_prefix": "s3://jobs/checkpoints/${aws:userid}/"}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 2, result.output
    fields = {line.split(":", 1)[0].strip(): line for line in result.output.splitlines()[1:]}
    assert set(fields) == {"dataset.uri", "dataset.replicas.us-west-2", "checkpoint.s3_prefix"}, result.output
    spec = JobSpec.model_validate(doc)  # (the models pass it: the handler's own checks, with buckets)
    handler = dict(dataset_place_problems(spec, ("s3://data/",)) + checkpoint_place_problems(spec, ("s3://jobs/",)))
    for field, line in fields.items():
        assert line.strip() == f"{field}: {handler[field]}", (line, handler[field])
        assert "which the node's IAM policy would read as a pattern" in line


@pytest.mark.parametrize(("field", "value", "unset"), [
    ("resources.max_hourly_price", ".inf", "leave it out for no limit"),
    ("resources.max_hourly_price", "'1e999'", "leave it out for no limit"),
    ("health.hang_after_s", ".inf", "null turns the check off"),
    ("health.loss_spike_z", ".nan", "null turns the check off"),  # (NaN read "greater than 0")
    ("health.grad_norm_factor", ".inf", "null turns the check off"),
    ("health.grad_norm_max", "'inf'", "null turns the check off"),
    ("health.straggler_factor", ".inf", "null turns the check off"),
])
def test_an_optional_limit_given_no_finite_number_is_refused_naming_it(
        tmp_path: Path, field: str, value: str, unset: str) -> None:
    """`max_hourly_price: .inf` validated and was stored as null (JSON has no infinity): no limit, without a
    word; a health limit the same, its check silently off. `spotrelay validate` names the field instead."""
    from typer.testing import CliRunner

    from spotrelay.cli.main import app

    section, name = field.split(".")
    doc = json.loads(json.dumps(MINIMAL))
    text = yaml.safe_dump(doc if section != "resources" else {k: v for k, v in doc.items() if k != section})
    extra = f"{section}:\n" + ("  nodes: 2\n" if section == "resources" else "") + f"  {name}: {value}\n"
    path = tmp_path / "job.yaml"
    path.write_text(text + extra)
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 2, result.output
    assert f"  {field}: must be a finite number; {unset} (got " in result.output, result.output
    assert len(result.output.strip().splitlines()) == 2, result.output  # that field alone
