"""What a job's nodes do in S3 is what their per-job policy allows (spotrelay/adapters/iam_job_profile.py):
a resumed job's agent restores and saves in the stopped job's checkpoints (its durable tier's real calls
on moto: restore the newest commit, save, prune), and the training reads the spec's dataset in the
team's own bucket (a listing and its shards).

moto enforces no IAM here, so the calls are recorded from the real tier and weighed by IAM's own rules
for S3 (the action each operation is authorized as, the object or bucket ARN, ``s3:prefix`` on a
listing). Before 7 December the policy named ``checkpoints/<new job>/`` only, so on AWS every resumed
job's first restore was denied, and it named no dataset nor any listing of ``data/``.
"""

from __future__ import annotations

from collections.abc import Iterator
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import pytest
import yaml
from botocore.client import BaseClient

from agent.checkpoint.local_tier import LocalTier
from agent.checkpoint.pipeline import Pipeline, Topology
from agent.checkpoint.restore import choose
from agent.checkpoint.s3_tier import MiB, S3Tier
from spotrelay.adapters import aws as aws_clients
from spotrelay.adapters.iam_job_profile import JobProfileConfig, job_policy
from spotrelay.spec.checks import checkpoint_place_problems, dataset_place_problems
from spotrelay.spec.models import JobSpec
from tests.conftest import ROOT
from tests.infrastructure.aws_calls import ACTION_NAMES
from tests.integration.s3_as_aws import ConditionedListing
from tests.integration.test_checkpoint_s3 import _save

# what IAM authorizes each S3 operation as, beyond ACTION_NAMES (the multipart upload is PutObject's)
AUTHORIZED_AS = {**ACTION_NAMES, "s3:CreateMultipartUpload": "s3:PutObject", "s3:UploadPart": "s3:PutObject",
                 "s3:CompleteMultipartUpload": "s3:PutObject"}
Call = tuple[str, str, str | None]  # (IAM action, resource ARN, s3:prefix of a listing)


def allowed(policy: dict[str, Any], call: Call) -> bool:
    """IAM's Allow for one S3 call (no Deny statements here): an action, a resource and, where a
    statement has one, its ``StringLike`` condition on ``s3:prefix`` all match."""
    action, resource, prefix = call
    for s in policy["Statement"]:
        actions = s["Action"] if isinstance(s["Action"], list) else [s["Action"]]
        resources = s["Resource"] if isinstance(s["Resource"], list) else [s["Resource"]]
        if not any(fnmatchcase(action, a) for a in actions) or not any(fnmatchcase(resource, r) for r in resources):
            continue
        wanted = s.get("Condition", {}).get("StringLike", {}).get("s3:prefix")
        if wanted is None or (prefix is not None and any(fnmatchcase(prefix, w) for w in wanted)):
            return True
    return False


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Call]]:
    """Every S3 call from now on, as (action, resource, prefix); a DeleteObjects counts per key."""
    calls: list[Call] = []
    original = BaseClient._make_api_call  # type: ignore[attr-defined]

    def recording(self: BaseClient, operation: str, params: dict[str, Any]) -> Any:
        if self.meta.service_model.signing_name == "s3":
            action = AUTHORIZED_AS.get(f"s3:{operation}", f"s3:{operation}")
            bucket = f"arn:aws:s3:::{params['Bucket']}"
            if action == "s3:ListBucket":
                calls.append((action, bucket, params.get("Prefix", "")))
            elif operation == "DeleteObjects":
                calls.extend((action, f"{bucket}/{o['Key']}", None) for o in params["Delete"]["Objects"])
            else:  # (a bucket-level call, CreateBucket in a test's set-up, names the bucket)
                calls.append((action, f"{bucket}/{params['Key']}" if "Key" in params else bucket, None))
        return original(self, operation, params)

    monkeypatch.setattr(BaseClient, "_make_api_call", recording)
    yield calls


def _stopped_job(bucket: str, tmp_path: Path) -> str:
    """The stopped job's durable tier, three commits in it; its URI as ``spotrelay resume`` names it."""
    uri = f"s3://{bucket}/checkpoints/old-job"
    s3 = S3Tier(uri, client=lambda: aws_clients.client("s3"), part_size=5 * MiB)
    local = LocalTier(tmp_path / "old-node")
    pipeline = Pipeline(local, s3, Topology(), tmp_path / "old-control", keep_local=2, keep_s3=2, timeout_s=30)
    try:
        for step in (2, 4, 6):
            assert _save(pipeline, local, step, numel=MiB).error is None
    finally:
        pipeline.close()
    return uri + "/"


def _resumed_node(uri: str, tmp_path: Path) -> None:
    """What a node of the resumed job does with that tier: restore the newest commit, save two more
    (a 12 MiB shard: a multipart upload), the retention pruning the oldest."""
    s3 = S3Tier(uri.rstrip("/"), client=lambda: aws_clients.client("s3"), part_size=5 * MiB)
    local = LocalTier(tmp_path / "new-node")
    manifest = choose(local, s3)
    assert manifest is not None and manifest.step == 6
    pipeline = Pipeline(local, s3, Topology(), tmp_path / "new-control", keep_local=2, keep_s3=2, timeout_s=30)
    try:
        for step in (8, 10):
            assert _save(pipeline, local, step).error is None
    finally:
        pipeline.close()
    assert s3.steps() == [10, 8]


def _policy(bucket: str, prefix: str, datasets: list[str] | None = None) -> dict[str, Any]:
    config = JobProfileConfig(account="123456789012", jobs_bucket=bucket, data_buckets={"us-west-2": "data-uw2"})
    return job_policy(config, "new-job", f"s3://{bucket}/submissions/new.yaml", checkpoint_prefix=prefix,
                      dataset_uris=datasets)


def test_a_resumed_jobs_nodes_may_do_all_they_do_on_the_stopped_jobs_checkpoints(
        aws: dict[str, str], tmp_path: Path, recorded: list[Call]) -> None:
    uri = _stopped_job(aws["bucket"], tmp_path)
    recorded.clear()
    _resumed_node(uri, tmp_path)
    actions = {a for a, _, _ in recorded}
    assert {"s3:ListBucket", "s3:GetObject", "s3:PutObject", "s3:DeleteObject"} <= actions, actions
    policy = _policy(aws["bucket"], uri)
    denied = [c for c in recorded if not allowed(policy, c)]
    assert not denied, f"the resumed job's policy refuses {denied[:5]}"
    # ... and no further than the stopped job's checkpoints and its own
    for other in (("s3:GetObject", f"arn:aws:s3:::{aws['bucket']}/checkpoints/another-job/step-00000006/m", None),
                  ("s3:ListBucket", f"arn:aws:s3:::{aws['bucket']}", "checkpoints/"),
                  ("s3:ListBucket", f"arn:aws:s3:::{aws['bucket']}", "checkpoints/old-job-2/"),
                  # a bare prefix lists every folder it begins: old-job-2's keys, new-job-2's
                  ("s3:ListBucket", f"arn:aws:s3:::{aws['bucket']}", "checkpoints/old-job"),
                  ("s3:ListBucket", f"arn:aws:s3:::{aws['bucket']}", "checkpoints/new-job"),
                  ("s3:PutObject", f"arn:aws:s3:::{aws['bucket']}/submissions/x.yaml", None)):
        assert not allowed(policy, other), other


def test_the_policy_without_the_specs_prefix_refuses_the_restore(
        aws: dict[str, str], tmp_path: Path, recorded: list[Call]) -> None:
    """The evaluator can fail: the job's own ``checkpoints/new-job/`` alone (the policy before the fix)
    denies the restore's first listing."""
    uri = _stopped_job(aws["bucket"], tmp_path)
    recorded.clear()
    _resumed_node(uri, tmp_path)
    denied = [c for c in recorded if not allowed(_policy(aws["bucket"], ""), c)]
    assert denied and denied[0][0] == "s3:ListBucket", denied[:3]


@pytest.mark.parametrize(("prefix", "ok"), [
    ("s3://jobs-b/checkpoints/old-job/", True),
    ("s3://data-uw2/checkpoints/team/run-1", True),
    ("s3://jobs-b/checkpoints/", False),  # the whole folder: every job's checkpoints
    ("s3://jobs-b/submissions/x/", False),
    ("s3://jobs-bx/checkpoints/old-job/", False),
    ("s3://team-bucket/ckpt/", False),
    ("s3://jobs-b/checkpoints/*/", False),  # IAM would read it as every job's checkpoints
    ("s3://jobs-b/checkpoints/${aws:userid}/", False),
])
def test_a_prefix_outside_what_nodes_may_write_is_refused_at_submission(prefix: str, ok: bool) -> None:
    doc = yaml.safe_load((ROOT / "examples" / "tiny.yaml").read_text())
    spec = JobSpec.model_validate({**doc, "checkpoint": {**doc.get("checkpoint", {}), "s3_prefix": prefix}})
    problems = checkpoint_place_problems(spec, ("s3://jobs-b/checkpoints/", "s3://data-uw2/checkpoints/"))
    assert (problems == []) is ok, problems
    if not ok:
        assert problems[0][0] == "checkpoint.s3_prefix"
        assert "s3://jobs-b/checkpoints/<name>/" in problems[0][1] or "pattern" in problems[0][1]


def test_a_pattern_in_a_prefix_is_never_granted() -> None:
    """A job recorded before submission refused patterns still gets none in its nodes' policy."""
    policy = _policy("jobs-b", "s3://jobs-b/checkpoints/*/")
    assert not allowed(policy, ("s3:GetObject", "arn:aws:s3:::jobs-b/checkpoints/other-job/step-00000002/m", None))
    assert "ListSpecCheckpoints" not in {s["Sid"] for s in policy["Statement"]}


def _read_dataset(bucket: str, prefix: str) -> list[bytes]:
    """What a training script does with its dataset: list the shards under the prefix, read each."""
    from spotrelay.adapters.aws import client

    s3 = client("s3")
    keys = [o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
            for o in page.get("Contents", [])]
    return [s3.get_object(Bucket=bucket, Key=k)["Body"].read() for k in keys]


def test_the_training_may_list_and_read_its_dataset_in_the_teams_bucket_and_nothing_beside(
        aws: dict[str, str], recorded: list[Call]) -> None:
    from spotrelay.adapters.aws import client

    s3 = client("s3")
    s3.create_bucket(Bucket="acme-ml-data")
    for key in ("redpajama/shard-000.bin", "redpajama/shard-001.bin", "secret-eval/answers.bin"):
        s3.put_object(Bucket="acme-ml-data", Key=key, Body=key.encode())
    s3.create_bucket(Bucket="data-uw2")
    s3.put_object(Bucket="data-uw2", Key="data/redpajama/shard-000.bin", Body=b"replica")
    recorded.clear()
    assert len(_read_dataset("acme-ml-data", "redpajama/")) == 2
    assert _read_dataset("data-uw2", "data/redpajama/") == [b"replica"]  # the replica in a data bucket
    datasets = ["s3://acme-ml-data/redpajama/", "s3://data-uw2/data/redpajama/"]
    policy = _policy(aws["bucket"], "", datasets)
    denied = [c for c in recorded if not allowed(policy, c)]
    assert not denied, f"the job's policy refuses its own dataset: {denied}"
    assert {a for a, _, _ in recorded} == {"s3:ListBucket", "s3:GetObject"}
    for beside in (("s3:GetObject", "arn:aws:s3:::acme-ml-data/secret-eval/answers.bin", None),
                   ("s3:ListBucket", "arn:aws:s3:::acme-ml-data", "secret-eval/"),
                   ("s3:ListBucket", "arn:aws:s3:::acme-ml-data", ""),
                   ("s3:PutObject", "arn:aws:s3:::acme-ml-data/redpajama/shard-002.bin", None)):
        assert not allowed(policy, beside), beside
    # the policy before: no dataset named, and no listing of a data bucket's data/
    before = [c for c in recorded if not allowed(_policy(aws["bucket"], ""), c)]
    assert ("s3:ListBucket", "arn:aws:s3:::acme-ml-data", "redpajama/") in before


def test_a_dataset_that_is_one_object_or_a_whole_bucket_is_granted_as_named() -> None:
    one = _policy("jobs-b", "", ["s3://acme-ml-data/corpus.tar"])
    assert allowed(one, ("s3:GetObject", "arn:aws:s3:::acme-ml-data/corpus.tar", None))
    assert not allowed(one, ("s3:GetObject", "arn:aws:s3:::acme-ml-data/corpus.tar.bak", None))
    whole = _policy("jobs-b", "", ["s3://acme-ml-data/"])
    assert allowed(whole, ("s3:ListBucket", "arn:aws:s3:::acme-ml-data", ""))
    assert allowed(whole, ("s3:GetObject", "arn:aws:s3:::acme-ml-data/any/key", None))
    assert not allowed(_policy("jobs-b", "", ["s3://acme-ml-data/*"]),
                       ("s3:GetObject", "arn:aws:s3:::acme-ml-data/x", None))  # a pattern is never granted


@pytest.mark.parametrize(("uri", "replica", "fields"), [
    ("s3://data-uw2/data/redpajama/", None, []),
    ("s3://acme-ml-data/redpajama/", "s3://acme-ml-data-usw2/redpajama/", []),
    ("s3://acme-ml-data", None, []),  # the whole listed bucket
    ("s3://data-uw2/checkpoints/x/", None, ["dataset.uri"]),  # a data bucket outside data/
    ("s3://someone-elses/corpus/", "s3://acme-ml-data/corpus/", ["dataset.uri"]),
    ("s3://acme-ml-data/corpus/", "s3://acme-ml-datax/corpus/", ["dataset.replicas.us-west-2"]),
    ("s3://acme-ml-data/*/", None, ["dataset.uri"]),
])
def test_a_dataset_the_nodes_could_not_read_is_refused_at_submission(
        uri: str, replica: str | None, fields: list[str]) -> None:
    doc = yaml.safe_load((ROOT / "examples" / "tiny.yaml").read_text())
    dataset: dict[str, Any] = {"uri": uri, **({"replicas": {"us-west-2": replica}} if replica else {})}
    spec = JobSpec.model_validate({**doc, "dataset": dataset})
    roots = ("s3://data-uw2/data/", "s3://acme-ml-data/", "s3://acme-ml-data-usw2/")
    problems = dataset_place_problems(spec, roots)
    assert [f for f, _ in problems] == fields, problems
    assert dataset_place_problems(spec, ()) == []  # no roots: the twin checks nothing


def test_a_fresh_jobs_first_commit_on_a_role_without_a_plain_listing(aws: dict[str, str], tmp_path: Path,
                                                                     recorded: list[Call]) -> None:
    """The first commit reads ``latest`` before writing it, and a rank waits for the others' parts and the
    manifest: each read a missing key, which S3 answers with 403 to the node's role. Only NoSuchKey and
    404 read as missing, so on AWS every job's first save failed; the tier now lists that one key."""
    s3 = S3Tier(f"s3://{aws['bucket']}/checkpoints/new-job", client=lambda: ConditionedListing(
        aws_clients.client("s3")), part_size=5 * MiB)
    assert s3.latest() is None and s3.manifest(2) is None
    local = LocalTier(tmp_path / "node")
    pipeline = Pipeline(local, s3, Topology(), tmp_path / "control", keep_local=2, keep_s3=2, timeout_s=30)
    recorded.clear()
    try:
        for step in (2, 4):
            assert _save(pipeline, local, step, numel=MiB).error is None
    finally:
        pipeline.close()
    assert s3.latest() == 4 and s3.manifest(4) is not None
    # every call, the key's own listing included, is one this job's policy allows
    assert not [c for c in recorded if not allowed(_policy_for("new-job", aws["bucket"]), c)], recorded
    assert any(a == "s3:ListBucket" and p and p.endswith("/latest") for a, _, p in recorded)
    # a key that is there but denied is a denial, never "missing"
    from botocore.exceptions import ClientError

    class Denied(ConditionedListing):
        def get_object(self, **kwargs: Any) -> Any:
            raise ClientError({"Error": {"Code": "AccessDenied", "Message": "Access Denied"}}, "GetObject")

    denied = S3Tier(s3.uri, client=lambda: Denied(aws_clients.client("s3")), part_size=5 * MiB)
    with pytest.raises(ClientError):
        denied.latest()


def _policy_for(job: str, bucket: str) -> dict[str, Any]:
    config = JobProfileConfig(account="123456789012", jobs_bucket=bucket, data_buckets={"us-west-2": "data-uw2"})
    return job_policy(config, job, f"s3://{bucket}/submissions/{job}.yaml")


def test_a_shard_gone_from_s3_reads_as_gone_under_a_403(aws: dict[str, str], tmp_path: Path) -> None:
    """A commit whose shard was deleted is never usable: restore falls back to an older one (corrupt),
    where a 403 read as a passing failure (unavailable) would fail attempt after attempt."""
    from agent.checkpoint.restore import materialize
    from spotrelay.errors import CorruptCheckpointError

    s3 = S3Tier(f"s3://{aws['bucket']}/checkpoints/new-job", client=lambda: ConditionedListing(
        aws_clients.client("s3")), part_size=5 * MiB)
    local = LocalTier(tmp_path / "node")
    pipeline = Pipeline(local, s3, Topology(), tmp_path / "control", keep_local=2, keep_s3=2, timeout_s=30)
    try:
        assert _save(pipeline, local, 2, numel=MiB).error is None
    finally:
        pipeline.close()
    manifest = s3.manifest(2)
    assert manifest is not None
    shard = s3.key(f"step-00000002/{manifest.shards[0].path}")
    aws_clients.client("s3").delete_object(Bucket=aws["bucket"], Key=shard)
    fresh = S3Tier(s3.uri, client=lambda: ConditionedListing(aws_clients.client("s3")), part_size=5 * MiB)
    try:
        with pytest.raises(CorruptCheckpointError, match="a shard is missing"):
            materialize(2, LocalTier(tmp_path / "fresh"), fresh)
    finally:
        fresh.close()


def test_the_places_a_submission_may_name_fit_the_nodes_iam_policy() -> None:
    """IAM takes at most 10,240 characters of inline policy per role (whitespace aside): at the bound
    submission keeps (MAX_NAMED_PLACES_CHARS), with long names everywhere else, the policy fits; past it
    the submission is refused (the first launch would fail on IAM's LimitExceeded)."""
    import json

    from spotrelay.spec.checks import MAX_NAMED_PLACES_CHARS, named_places_problems

    long = "spotrelay-long-pre"
    config = JobProfileConfig(prefix=long, account="123456789012", jobs_bucket=f"{long}-jobs-123456789012-us-east-1",
                              data_buckets={r: f"{long}-data-123456789012-{r}"
                                            for r in ("us-east-1", "us-east-2", "us-west-2", "eu-west-1")})
    each = MAX_NAMED_PLACES_CHARS // 6  # dataset.uri, 4 replicas, checkpoint.s3_prefix: each in its own bucket
    places = [f"s3://bucket-{i}-{'b' * 40}/" + "k" * (each - 55) for i in range(6)]
    assert sum(map(len, places)) <= MAX_NAMED_PLACES_CHARS
    doc = job_policy(config, "a" * 40 + "-0123456789ab", f"s3://{config.jobs_bucket}/submissions/{'x' * 100}.yaml",
                     checkpoint_prefix=places[5], dataset_uris=places[:5])
    assert len(json.dumps(doc, separators=(",", ":"))) < 10_240
    doc = yaml.safe_load((ROOT / "examples" / "tiny.yaml").read_text())
    regions = ("us-east-1", "us-east-2", "us-west-2", "eu-west-1")
    replicas = dict(zip(regions, places[1:5], strict=True))
    fine = JobSpec.model_validate({**doc, "dataset": {"uri": places[0], "replicas": replicas}})
    assert named_places_problems(fine) == []
    past = JobSpec.model_validate({**doc, "dataset": {"uri": places[0] + "k" * 300, "replicas": replicas}})
    assert [f for f, _ in named_places_problems(past)] == ["dataset"]
