"""The bounded loader and the launch checks against the hostile corpus (tests/hostile_corpus.py)."""

from __future__ import annotations

import tracemalloc

import pytest

from spotrelay.errors import SpecError
from spotrelay.spec import parse_spec, safe_yaml
from spotrelay.spec.load import suffix_problem
from tests.hostile_corpus import EXPECT, SPEC_HEAD, corpus

CORPUS = corpus()
CONTENT = sorted(name for name in CORPUS if suffix_problem(name) is None)


@pytest.mark.parametrize("name", CONTENT)
def test_every_hostile_file_is_refused_naming_the_field_or_cause(name: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(CORPUS[name], source=name)
    assert EXPECT[name] in str(info.value)
    assert info.value.source == name


def test_the_whole_corpus_parses_within_50_mb() -> None:
    """tracemalloc's peak is deterministic; the time side is measured in bench/spec_parse.py."""
    for name in CONTENT:
        tracemalloc.start()
        try:
            with pytest.raises(SpecError):
                parse_spec(CORPUS[name], source=name)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 50 * 2**20, f"{name}: peak {peak / 2**20:.1f} MiB"


@pytest.mark.parametrize("name", ["deep-flow.yaml", "deep-map.json", "duplicate-keys.yaml", "python-tag.yaml",
                                  "laughs.yaml", "recursive-alias.yaml", "broken.yaml"])
def test_the_pure_python_parser_refuses_the_same_way(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(safe_yaml, "_Loader", safe_yaml._PyLoader)
    with pytest.raises(SpecError) as info:
        parse_spec(CORPUS[name], source=name)
    assert EXPECT[name] in str(info.value)


def test_aliases_that_stay_small_are_fine() -> None:
    text = SPEC_HEAD + b"""launcher:
  type: deepspeed
  deepspeed_config:
    base: &zero {stage: 2, overlap_comm: true}
    zero_optimization: {<<: *zero, stage: 3}
tracking:
  tags: {team: &t platform, owner: *t}
"""
    spec = parse_spec(text)
    assert isinstance(spec.launcher.deepspeed_config, dict)
    assert spec.launcher.deepspeed_config["zero_optimization"] == {"stage": 3, "overlap_comm": True}
    assert spec.tracking.tags == {"team": "platform", "owner": "platform"}


def test_dates_stay_strings_so_what_validates_is_what_is_stored() -> None:
    spec = parse_spec(SPEC_HEAD + b"tracking: {tags: {started: 2024-01-02}}\n")
    assert spec.tracking.tags == {"started": "2024-01-02"}


def test_core_tags_and_a_utf8_bom_are_accepted() -> None:
    spec = parse_spec("\ufeff".encode() + SPEC_HEAD.replace(b"nodes: 1", b"nodes: !!int 3"))
    assert spec.resources.nodes == 3


def test_nesting_up_to_the_limit_is_accepted() -> None:
    depth = safe_yaml.MAX_DEPTH - 3  # launcher.deepspeed_config.x sits three levels down
    nest = "{a: " * depth + "1" + "}" * depth
    spec = parse_spec(SPEC_HEAD + f"launcher: {{type: deepspeed, deepspeed_config: {{x: {nest}}}}}\n".encode())
    assert spec.launcher.type == "deepspeed"


@pytest.mark.parametrize(("name", "problem"), [("job.yaml", None), ("JOB.YML", None), ("a.Json", None),
                                               ("notes.txt", "has 'txt'"), ("submissions/noext", "no suffix")])
def test_suffixes(name: str, problem: str | None) -> None:
    found = suffix_problem(name)
    assert found == problem if problem is None else problem in (found or "")


@pytest.mark.parametrize(("script", "ok"), [("train.py", True), ("src/../train.py", True), ("./a/b.py", True),
                                            ("../train.py", False), ("a/../../b.py", False), ("/opt/t.py", False),
                                            ("~/t.py", False)])
def test_script_stays_inside_the_working_dir(script: str, ok: bool) -> None:
    text = SPEC_HEAD.replace(b"{command: [python, train.py]}", f"{{script: '{script}'}}".encode())
    if ok:
        assert parse_spec(text).entrypoint.script == script
    else:
        with pytest.raises(SpecError) as info:
            parse_spec(text)
        assert info.value.errors[0][0] == "entrypoint.script"


def test_batch_that_deepspeed_would_accept_passes() -> None:
    text = SPEC_HEAD.replace(b"nodes: 1", b"nodes: 2, gpus_per_node: 8") + (
        b"launcher: {type: deepspeed, deepspeed_config: {train_batch_size: 512, "
        b"train_micro_batch_size_per_gpu: 4, gradient_accumulation_steps: 8}}\n")
    assert parse_spec(text).resources.nodes == 2


def test_user_facing_spotrelay_knobs_stay_allowed_in_env() -> None:
    text = SPEC_HEAD.replace(b"{command: [python, train.py]}",
                             b"{command: [python, train.py], env: {SPOTRELAY_NOTICE_TRAINING: '0'}}")
    assert parse_spec(text).entrypoint.env == {"SPOTRELAY_NOTICE_TRAINING": "0"}


def test_more_ranks_per_node_than_the_instance_has_gpus_is_refused() -> None:
    text = SPEC_HEAD.replace(b"nodes: 1", b"nodes: 1, gpus_per_node: 16, instance_types: [p5.48xlarge]")
    with pytest.raises(SpecError) as info:
        parse_spec(text)
    assert info.value.errors == [("resources.gpus_per_node", "is 16, but p5.48xlarge has 8 GPUs")]
    assert parse_spec(text.replace(b"16", b"8")).resources.gpus_per_node == 8
