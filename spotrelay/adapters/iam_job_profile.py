"""One IAM role and instance profile per job, so a node reaches only its own job's data and calls.

An instance profile cannot see its instance's tags, so a profile shared by every job would let a
node read other jobs' checkpoints. Before each launch the compute adapter ensures
``<prefix>-agent-job-<hash of job id>`` under path ``/spotrelay/``: trusted by EC2 only, bounded by
the stack's permissions boundary, with one inline policy naming this job's id everywhere:

- S3 ``checkpoints/<job>/`` read/write/delete (and list with that prefix) on the home jobs bucket and
  on each training region's data bucket, and the same on the spec's ``checkpoint.s3_prefix`` when it
  names another (a resumed job's: the stopped job's checkpoints, where its agent restores and goes on
  saving); ``data/`` and ``artifacts/agent/`` (the agent wheel) read;
- GetObject on the job's spec object (``config_uri``);
- DynamoDB GetItem/Query (read only) on the jobs and nodes tables with ``dynamodb:LeadingKeys`` = job
  id: the agent's port reads its records; it never writes one (the controller's handlers do);
- ``events:PutEvents`` on the home bus with ``events:source`` = ``spotrelay.agent``: the agent's
  only way to change anything the controller keeps;
- CreateLogStream/PutLogEvents on the job's own streams (``<job>/...``) of the training log group.

Creation is idempotent (EntityAlreadyExists is fine); ``delete`` removes profile and role at teardown;
``jobs`` lists the roles by their job tag, so reconcile can delete those a failed teardown left.
IAM is eventually consistent: the first launches after creation may be refused for an invalid
profile; the compute adapter turns that into ``RetryableError`` and the workflow retries.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterator
from typing import Any

from botocore.exceptions import ClientError
from pydantic import BaseModel, ConfigDict, Field

from spotrelay.adapters.aws import error_code
from spotrelay.contracts.agent import AGENT_TABLE_ACTIONS
from spotrelay.contracts.events import AGENT_SOURCE
from spotrelay.ports.logs import LOG_GROUP_DEFAULT
from spotrelay.resources import RESOURCES
from spotrelay.spec.checks import iam_pattern

PATH = "/spotrelay/"
POLICY_NAME = "job"
JOB_TAG = "spotrelay:job-id"
TRUST = {"Version": "2012-10-17", "Statement": [
    {"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}]}


class JobProfileConfig(BaseModel):
    """What the per-job policy names. Unset fields come from ``spotrelay.settings`` (home region)."""

    model_config = ConfigDict(extra="forbid")
    prefix: str = "spotrelay"
    partition: str = "aws"
    account: str | None = Field(None, description="default: SPOTRELAY_ACCOUNT, else '*' in ARNs")
    home_region: str | None = None
    jobs_bucket: str | None = None
    jobs_table: str | None = None
    nodes_table: str | None = None
    event_bus_arn: str | None = None
    data_buckets: dict[str, str] = Field(default_factory=dict, description="training region -> data bucket")
    permissions_boundary_arn: str | None = None


def profile_name(prefix: str, job_id: str) -> str:
    """Role and profile name; a hash keeps any job id within IAM's 64 characters and character set."""
    name = f"{prefix}-agent-job-{hashlib.sha256(job_id.encode()).hexdigest()[:16]}"
    if len(name) > 64:
        raise ValueError(f"prefix {prefix!r} too long for IAM role names ({name})")
    return name


def _spec_object(config_uri: str) -> str | None:
    if not config_uri.startswith("s3://"):
        return None
    bucket, _, key = config_uri.removeprefix("s3://").partition("/")
    return f"{bucket}/{key}" if bucket and key else None


def split_s3(uri: str) -> tuple[str, str]:
    """``s3://bucket/key/`` -> (bucket, key without the slashes around it)."""
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bucket, key.strip("/")


def _under(key: str) -> list[str]:
    """A listing's ``s3:prefix`` inside the folder ``key`` only: ``key`` bare would also list the keys of
    every folder it begins (``checkpoints/job-1`` lists ``checkpoints/job-10/...``); the agent lists
    ``key/...`` only (agent/checkpoint/s3_tier.py)."""
    return [f"{key}/*"]


def _dataset_statements(part: str, uris: list[str]) -> list[dict[str, Any]]:
    """Read-only on the spec's dataset (``dataset.uri`` and its replicas): each object under each prefix
    (or the object itself), and listing exactly those prefixes; a URI holding a pattern is never granted
    (submission refuses one: ``spec.checks.dataset_place_problems``)."""
    places = [split_s3(u) for u in uris if not iam_pattern(u)]
    if not places:
        return []
    objects = sorted({f"arn:{part}:s3:::{b}/{k}{suffix}" if k else f"arn:{part}:s3:::{b}/*"
                      for b, k in places for suffix in ("", "/*")})
    statements: list[dict[str, Any]] = [{"Sid": "Dataset", "Effect": "Allow", "Action": "s3:GetObject",
                                         "Resource": objects}]
    for i, bucket in enumerate(sorted({b for b, _ in places})):
        keys = sorted({k for b, k in places if b == bucket})
        listing: dict[str, Any] = {"Sid": f"ListDataset{i}", "Effect": "Allow", "Action": "s3:ListBucket",
                                   "Resource": f"arn:{part}:s3:::{bucket}"}
        if "" not in keys:  # (the whole bucket is the dataset: any prefix)
            listing["Condition"] = {"StringLike": {"s3:prefix": [p for k in keys for p in (k, f"{k}/*")]}}
        statements.append(listing)
    return statements


def job_policy(config: JobProfileConfig, job_id: str, config_uri: str = "",
               checkpoint_prefix: str = "", dataset_uris: list[str] | None = None) -> dict[str, Any]:
    from spotrelay.settings import settings

    s, part = settings(), config.partition
    acct = config.account or os.environ.get("SPOTRELAY_ACCOUNT") or "*"
    home = config.home_region or s.region
    ckpt = f"{RESOURCES.checkpoints_prefix}{job_id}"
    buckets = [config.jobs_bucket or s.bucket, *config.data_buckets.values()]
    bucket_arns = [f"arn:{part}:s3:::{b}" for b in buckets]
    statements: list[dict[str, Any]] = [
        {"Sid": "Checkpoints", "Effect": "Allow",
         "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"],
         "Resource": [f"{arn}/{ckpt}/*" for arn in bucket_arns]},
        {"Sid": "ListCheckpoints", "Effect": "Allow", "Action": "s3:ListBucket", "Resource": bucket_arns,
         "Condition": {"StringLike": {"s3:prefix": _under(ckpt)}}},
    ]
    bucket, key = split_s3(checkpoint_prefix)
    # the spec's durable tier (the boundary keeps it under a bucket's checkpoints/); never a pattern
    # (submission refuses one: spec.checks.checkpoint_place_problems), which would reach other jobs'
    if bucket and key and not iam_pattern(checkpoint_prefix):
        statements[0]["Resource"].append(f"arn:{part}:s3:::{bucket}/{key}/*")
        statements.append({"Sid": "ListSpecCheckpoints", "Effect": "Allow", "Action": "s3:ListBucket",
                           "Resource": f"arn:{part}:s3:::{bucket}",
                           "Condition": {"StringLike": {"s3:prefix": _under(key)}}})
    reads = [f"arn:{part}:s3:::{b}/{p}*" for b in config.data_buckets.values() for p in ("data/", "artifacts/agent/")]
    reads.append(f"arn:{part}:s3:::{config.jobs_bucket or s.bucket}/{RESOURCES.code_prefix}*")  # entrypoint.code
    spec = _spec_object(config_uri)
    if spec:
        reads.append(f"arn:{part}:s3:::{spec}")
    if reads:
        statements.append({"Sid": "Read", "Effect": "Allow", "Action": "s3:GetObject", "Resource": reads})
    if config.data_buckets:  # the shared datasets under data/ are listed as well as read
        statements.append({"Sid": "ListData", "Effect": "Allow", "Action": "s3:ListBucket",
                           "Resource": [f"arn:{part}:s3:::{b}" for b in config.data_buckets.values()],
                           "Condition": {"StringLike": {"s3:prefix": ["data/*"]}}})
    statements.extend(_dataset_statements(part, dataset_uris or []))
    table = f"arn:{part}:dynamodb:{home}:{acct}:table/"
    statements.append({  # read only: one writer per record, the controller (spotrelay/contracts/agent.py)
        "Sid": "JobItems", "Effect": "Allow",
        "Action": list(AGENT_TABLE_ACTIONS),
        "Resource": [table + (config.jobs_table or s.jobs_table), table + (config.nodes_table or s.nodes_table)],
        "Condition": {"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": [job_id]}},
    })
    bus = config.event_bus_arn or (s.event_bus if s.event_bus.startswith("arn:")
                                   else f"arn:{part}:events:{home}:{acct}:event-bus/{s.event_bus}")
    statements.append({"Sid": "AgentEvents", "Effect": "Allow", "Action": "events:PutEvents", "Resource": bus,
                       "Condition": {"StringEquals": {"events:source": AGENT_SOURCE}}})
    # the training output: only this job's streams in the training log group
    group = f"arn:{part}:logs:{home}:{acct}:log-group:{LOG_GROUP_DEFAULT}"
    statements.append({"Sid": "TrainingLogs", "Effect": "Allow",
                       "Action": ["logs:CreateLogStream", "logs:PutLogEvents"],
                       "Resource": f"{group}:log-stream:{job_id}/*"})
    return {"Version": "2012-10-17", "Statement": statements}


class JobProfiles:
    """Ensure and delete the per-job role and instance profile (``iam`` is a boto3 IAM client)."""

    def __init__(self, config: JobProfileConfig, iam: Any) -> None:
        self._config, self._iam = config, iam
        self._arns: dict[str, str] = {}  # job id -> profile ARN, while the Lambda stays warm

    def ensure(self, job_id: str, config_uri: str = "", checkpoint_prefix: str = "",
               dataset_uris: list[str] | None = None) -> str:
        name = profile_name(self._config.prefix, job_id)
        role_args: dict[str, Any] = {
            "Path": PATH, "RoleName": name, "AssumeRolePolicyDocument": json.dumps(TRUST),
            "Description": f"spotrelay agent of job {job_id}"[:1000],
            "Tags": [{"Key": JOB_TAG, "Value": job_id[:256]}],
        }
        if self._config.permissions_boundary_arn:
            role_args["PermissionsBoundary"] = self._config.permissions_boundary_arn
        with _exists_ok():
            self._iam.create_role(**role_args)
        # put every time: cheap, and a changed spec or deployment gets the current policy
        self._iam.put_role_policy(RoleName=name, PolicyName=POLICY_NAME,
                                  PolicyDocument=json.dumps(job_policy(self._config, job_id, config_uri,
                                                                             checkpoint_prefix, dataset_uris)))
        if job_id in self._arns:
            return self._arns[job_id]
        try:
            profile = self._iam.create_instance_profile(InstanceProfileName=name, Path=PATH)["InstanceProfile"]
        except ClientError as exc:
            if error_code(exc) != "EntityAlreadyExists":
                raise
            profile = self._iam.get_instance_profile(InstanceProfileName=name)["InstanceProfile"]
        if name not in {r["RoleName"] for r in profile.get("Roles", [])}:
            with _exists_ok("LimitExceeded"):  # a concurrent call added it first (one role per profile)
                self._iam.add_role_to_instance_profile(InstanceProfileName=name, RoleName=name)
        self._arns[job_id] = str(profile["Arn"])
        return self._arns[job_id]

    def jobs(self, skip: frozenset[str] = frozenset()) -> dict[str, str]:
        """Job id -> role name of every per-job agent role of this prefix (from the role's job tag),
        but the roles of the ``skip`` jobs, whose tags are not read (one IAM call fewer each)."""
        found: dict[str, str] = {}
        start = f"{self._config.prefix}-agent-job-"
        known = {profile_name(self._config.prefix, job_id) for job_id in skip}
        for page in self._iam.get_paginator("list_roles").paginate(PathPrefix=PATH):
            for role in page.get("Roles", []):
                name = role["RoleName"]
                if not name.startswith(start) or name in known:
                    continue
                tags = self._iam.list_role_tags(RoleName=name).get("Tags", [])
                job_id = next((t["Value"] for t in tags if t["Key"] == JOB_TAG), None)
                if job_id and profile_name(self._config.prefix, job_id) == name:
                    found[job_id] = name
        return found

    def delete(self, job_id: str) -> None:
        name = profile_name(self._config.prefix, job_id)
        self._arns.pop(job_id, None)
        with _gone_ok():
            self._iam.remove_role_from_instance_profile(InstanceProfileName=name, RoleName=name)
        with _gone_ok():
            self._iam.delete_instance_profile(InstanceProfileName=name)
        with _gone_ok():
            self._iam.delete_role_policy(RoleName=name, PolicyName=POLICY_NAME)
        with _gone_ok():
            self._iam.delete_role(RoleName=name)


@contextlib.contextmanager
def _exists_ok(code: str = "EntityAlreadyExists") -> Iterator[None]:
    try:
        yield
    except ClientError as exc:
        if error_code(exc) != code:
            raise


def _gone_ok() -> contextlib.AbstractContextManager[None]:
    return _exists_ok("NoSuchEntity")
