"""The hostile corpus: files a careless or malicious user drops under submissions/.

Small files live in tests/hostile/; big ones are generated here (a repository of 300 KB blobs helps
nobody). ``EXPECT`` says what each rejection must name: a field path or the cause.
"""

from __future__ import annotations

from pathlib import Path

HOSTILE = Path(__file__).parent / "hostile"

# file name -> a text the rejection must contain (the field or the cause)
EXPECT: dict[str, str] = {
    "empty.yaml": "is empty",
    "blank.yaml": "is empty",
    "comments.yaml": "only comments",
    "binary.yaml": "not UTF-8",
    "image.yml": "not UTF-8",
    "latin1.yaml": "not UTF-8",
    "utf16.yaml": "not UTF-8",
    "deep-flow.yaml": "nests deeper",
    "deep-map.json": "nests deeper",
    "deep-block.yaml": "nests deeper",
    "laughs.yaml": "aliases expand",
    "laughs-scalar.yaml": "aliases expand",
    "recursive-alias.yaml": "contains it",
    "duplicate-keys.yaml": "resources.nodes: is given twice",
    "duplicate-top.json": "name: is given twice",
    "python-tag.yaml": "tags are not allowed",
    "python-tag-nested.yaml": "entrypoint.command: tags are not allowed",
    "custom-tag.yaml": "name: tags are not allowed",
    "binary-tag.yaml": "name: tags are not allowed",
    "two-docs.yaml": "more than one YAML document",
    "list-root.yaml": "(root): must be a mapping",
    "scalar-root.json": "(root): must be a mapping",
    "broken.yaml": "not valid YAML or JSON at line",
    "broken.json": "not valid YAML or JSON at line",
    "traversal-script.yaml": "entrypoint.script: leaves entrypoint.working_dir",
    "absolute-script.yaml": "entrypoint.script: must be relative",
    "deepspeed-reserved.yaml": "launcher.deepspeed_config.checkpoint",
    "deepspeed-batch.yaml": "launcher.deepspeed_config.train_batch_size",
    "deepspeed-path.yaml": "launcher.deepspeed_config: leaves",
    "env-reserved.yaml": "entrypoint.env.MASTER_ADDR",
    "nul-in-command.yaml": "entrypoint.command[1]: contains a NUL",
    "unknown-field.yaml": "resources.gpus: unknown field",
    "wrong-types.json": "resources.nodes",
    "yaml-booleans.yaml": "resources.nodes: expected a number, got true",  # YAML 1.1's yes/no: not 1 and 0
    # the suffix is wrong, whatever the content
    "notes.txt": "spec is .yaml, .yml or .json",
    "noext": "spec is .yaml, .yml or .json",
    # generated below
    "huge.yaml": "the limit is 262144",
    "many-values.json": "more than 5000 values",
    "over-item-limit.yaml": "(the job record must fit in DynamoDB)",
}

SPEC_HEAD = (b"version: 1\nname: gen\nentrypoint: {command: [python, train.py]}\nresources: {nodes: 1}\n"
             b"checkpoint: {every_steps: 10}\n")


def generated() -> dict[str, bytes]:
    big = "x" * 9000
    tags = "".join(f"    t{i}: *big\n" for i in range(24))
    return {
        "huge.yaml": SPEC_HEAD + b"# " + b"x" * (300 * 1024) + b"\n",
        "many-values.json": b"[" + b"0," * 60_000 + b"0]",
        # 9 KB written once, stored 24 times: small file, a job item past what DynamoDB takes
        "over-item-limit.yaml": SPEC_HEAD + f"tracking:\n  mlflow_experiment: &big {big}\n  tags:\n{tags}".encode(),
    }


def corpus() -> dict[str, bytes]:
    files = {p.name: p.read_bytes() for p in sorted(HOSTILE.iterdir()) if p.is_file()}
    files.update(generated())
    missing = set(EXPECT) ^ set(files)
    assert not missing, f"corpus and expectations differ: {sorted(missing)}"
    return files
