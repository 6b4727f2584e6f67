"""Per-job agent instance profiles: created before launch (moto's IAM), scoped to the job, reused by a
second launch, deleted at teardown; a not-yet-visible profile is retried, then a RetryableError (Stubber)."""

from __future__ import annotations

import json
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from botocore.stub import ANY, Stubber

from spotrelay.adapters.ec2_compute import Ec2Compute, Ec2ComputeConfig
from spotrelay.adapters.iam_job_profile import JobProfileConfig, profile_name
from spotrelay.errors import RetryableError
from spotrelay.ports.compute import LaunchRequest
from tests.integration.test_ec2_compute import CONFIG, POOL, PlacementGroupsOnTop, expect_launch_prelude, request

PROFILES = JobProfileConfig(prefix="spotrelay", account="123456789012", data_buckets={"us-east-1": "data-ue1"},
                            permissions_boundary_arn="arn:aws:iam::123456789012:policy/spotrelay-agent-boundary")


class RecordingTemplates(PlacementGroupsOnTop):
    """moto's fleets drop the template's profile, so the test reads it from the template written."""

    def __init__(self, ec2: Any) -> None:
        super().__init__(ec2)
        self.template_data: list[dict[str, Any]] = []

    def create_launch_template(self, **kwargs: Any) -> Any:
        self.template_data.append(kwargs["LaunchTemplateData"])
        return self._ec2.create_launch_template(**kwargs)


def launch(compute: Ec2Compute, job: str, attempt: int = 1) -> Any:
    return compute.launch(LaunchRequest(job_id=job, attempt=attempt, pool=POOL, count=1, ranks=[0],
                                        config_uri=f"s3://spotrelay-jobs/submissions/{job}.yaml"))


def policy_of(iam: Any, job: str) -> dict[str, Any]:
    doc = iam.get_role_policy(RoleName=profile_name("spotrelay", job), PolicyName="job")["PolicyDocument"]
    return doc if isinstance(doc, dict) else dict(json.loads(doc))


def test_each_job_gets_its_own_profile_reused_across_launches_and_deleted_at_teardown(aws: dict[str, str]) -> None:
    from spotrelay.adapters.aws import client

    ec2, iam = RecordingTemplates(client("ec2", "us-east-1")), client("iam")
    clients = {"ec2": ec2, "iam": iam}
    config = Ec2ComputeConfig(**{**CONFIG.model_dump(), "job_profiles": PROFILES})
    compute = Ec2Compute(config, client_factory=lambda service, region=None: clients[service])

    launch(compute, "job-a")
    name = profile_name("spotrelay", "job-a")
    profile = iam.get_instance_profile(InstanceProfileName=name)["InstanceProfile"]
    assert profile["Path"] == "/spotrelay/" and [r["RoleName"] for r in profile["Roles"]] == [name]
    role = iam.get_role(RoleName=name)["Role"]
    assert role["PermissionsBoundary"]["PermissionsBoundaryArn"] == PROFILES.permissions_boundary_arn
    assert "ec2.amazonaws.com" in json.dumps(role["AssumeRolePolicyDocument"])
    assert ec2.template_data[-1]["IamInstanceProfile"] == {"Arn": profile["Arn"]}  # nodes run as the job's

    text = json.dumps(policy_of(iam, "job-a"))
    assert "checkpoints/job-a/*" in text and "arn:aws:s3:::data-ue1/checkpoints/job-a/*" in text
    assert "submissions/job-a.yaml" in text and "spotrelay.agent" in text
    statements = policy_of(iam, "job-a")["Statement"]
    (items,) = [s for s in statements if s["Sid"] == "JobItems"]
    assert items["Condition"]["ForAllValues:StringEquals"]["dynamodb:LeadingKeys"] == ["job-a"]
    assert items["Action"] == ["dynamodb:GetItem", "dynamodb:Query"]  # read only: the agent writes no item
    assert not any(str(a).startswith("dynamodb:") for s in statements if s is not items
                   for a in (s["Action"] if isinstance(s["Action"], list) else [s["Action"]]))
    assert "checkpoints/*" not in text and "job-b" not in text

    launch(compute, "job-a", attempt=2)  # a second launch reuses the same profile
    assert ec2.template_data[-1]["IamInstanceProfile"] == {"Arn": profile["Arn"]}
    launch(compute, "job-b")
    assert ec2.template_data[-1]["IamInstanceProfile"] != {"Arn": profile["Arn"]}
    names = {p["InstanceProfileName"] for p in iam.list_instance_profiles(PathPrefix="/spotrelay/")["InstanceProfiles"]}
    assert names == {name, profile_name("spotrelay", "job-b")}
    assert "job-a" not in json.dumps(policy_of(iam, "job-b"))

    compute.terminate_job("job-a", ["us-east-1"])
    names = {p["InstanceProfileName"] for p in iam.list_instance_profiles(PathPrefix="/spotrelay/")["InstanceProfiles"]}
    assert names == {profile_name("spotrelay", "job-b")}
    with pytest.raises(iam.exceptions.NoSuchEntityException):
        iam.get_role(RoleName=name)
    compute.terminate_job("job-a", ["us-east-1"])  # a second teardown finds nothing and is fine

    # reconcile's view: roles listed by their job tag; another prefix's or a hand-made role is not ours
    iam.create_role(RoleName="spotrelay-agent-job-handmade", Path="/spotrelay/", AssumeRolePolicyDocument="{}")
    iam.create_role(RoleName="other-agent-job-x", Path="/spotrelay/", AssumeRolePolicyDocument="{}",
                    Tags=[{"Key": "spotrelay:job-id", "Value": "job-x"}])
    assert compute.job_profiles() == ["job-b"]
    assert compute.job_profiles(skip=frozenset({"job-b"})) == []  # a live job's role is passed over
    compute.delete_job_profile("job-b")
    assert compute.job_profiles() == []
    assert iam.list_instance_profiles(PathPrefix="/spotrelay/")["InstanceProfiles"] == []


def test_names_fit_iam_limits_for_any_job_id() -> None:
    long = profile_name("spotrelay", "x" * 500)
    assert len(long) <= 64 and long.startswith("spotrelay-agent-job-")
    assert profile_name("spotrelay", "a") != profile_name("spotrelay", "b")
    with pytest.raises(ValueError):
        profile_name("p" * 50, "a")


@pytest.mark.parametrize("where", ["exception", "fleet-errors", "recovers"])
def test_a_profile_not_yet_visible_to_ec2_is_retried_then_retryable(where: str) -> None:
    def make(service: str) -> Any:
        new: Any = boto3.client  # one helper for two services
        return new(service, region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x",
                   endpoint_url=f"https://{service}.amazonaws.com")

    ec2, iam = make("ec2"), make("iam")
    sleeps: list[float] = []
    config = Ec2ComputeConfig(**{**CONFIG.model_dump(), "job_profiles": PROFILES})
    compute = Ec2Compute(config, client_factory=lambda service, region=None: {"ec2": ec2, "iam": iam}[service],
                         sleep=sleeps.append)
    arn = "arn:aws:iam::123456789012:instance-profile/spotrelay/" + profile_name("spotrelay", "job-a")
    message = f"Value ({arn}) for parameter iamInstanceProfile.arn is invalid. Invalid IAM Instance Profile ARN"
    with Stubber(ec2) as es, Stubber(iam) as ist:
        es.add_response("describe_instances", {"Reservations": []})
        ist.add_response("create_role", {"Role": {
            "Path": "/spotrelay/", "RoleName": "role", "RoleId": "AROAEXAMPLE1234567",
            "Arn": "arn:aws:iam::123456789012:role/spotrelay/role", "CreateDate": "2026-01-01T00:00:00Z"}})
        ist.add_response("put_role_policy", {})
        ist.add_response("create_instance_profile", {"InstanceProfile": {
            "Path": "/spotrelay/", "InstanceProfileName": "prof", "InstanceProfileId": "AIPAEXAMPLE1234567",
            "Arn": arn, "CreateDate": "2026-01-01T00:00:00Z", "Roles": []}})
        ist.add_response("add_role_to_instance_profile", {})
        es.add_response("create_placement_group", {})
        es.add_response("create_launch_template", {"LaunchTemplate": {"LaunchTemplateName": "tmpl"}},
                        {"LaunchTemplateName": ANY, "LaunchTemplateData": ANY, "TagSpecifications": ANY})
        for _ in range(2 if where == "recovers" else 4):  # the first call and three retries
            if where == "fleet-errors":
                es.add_response("create_fleet", {"Instances": [], "Errors": [
                    {"ErrorCode": "InvalidParameterValue", "ErrorMessage": message}]})
            else:
                es.add_client_error("create_fleet", "InvalidParameterValue", message)
        if where == "recovers":
            es.add_response("create_fleet", {"Instances": [{"InstanceIds": ["i-0123456789abcdef0"]}]})
        es.add_response("delete_launch_template", {})
        if where == "recovers":
            es.add_response("create_tags", {})
            es.add_response("describe_instances", {"Reservations": []})
            (node,) = launch(compute, "job-a")
            assert node.instance_id == "i-0123456789abcdef0" and sleeps == [2.0, 4.0]
        else:
            with pytest.raises(RetryableError, match="instance profile"):
                launch(compute, "job-a")
            assert sleeps == [2.0, 4.0, 8.0]
        es.assert_no_pending_responses()
        ist.assert_no_pending_responses()


def test_other_invalid_parameters_are_not_retryable() -> None:
    ec2 = boto3.client("ec2", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x",
                       endpoint_url="https://ec2.us-east-1.amazonaws.com")
    compute = Ec2Compute(CONFIG, client_factory=lambda service, region=None: ec2)
    with Stubber(ec2) as stub:
        expect_launch_prelude(stub)
        stub.add_client_error("create_fleet", "InvalidParameterValue", "Value (x) for parameter subnetId is invalid")
        stub.add_response("delete_launch_template", {})
        with pytest.raises(ClientError):
            compute.launch(request())


def test_a_launch_naming_a_checkpoint_prefix_grants_it_to_the_nodes(aws: dict[str, str]) -> None:
    from spotrelay.adapters.aws import client

    ec2, iam = RecordingTemplates(client("ec2", "us-east-1")), client("iam")
    clients = {"ec2": ec2, "iam": iam}
    config = Ec2ComputeConfig(**{**CONFIG.model_dump(), "job_profiles": PROFILES})
    compute = Ec2Compute(config, client_factory=lambda service, region=None: clients[service])
    compute.launch(LaunchRequest(job_id="job-r", attempt=1, pool=POOL, count=1, ranks=[0],
                                 config_uri="s3://spotrelay-jobs/submissions/job-r.yaml",
                                 checkpoint_prefix="s3://spotrelay-jobs/checkpoints/job-old/"))
    statements = {s["Sid"]: s for s in policy_of(iam, "job-r")["Statement"]}
    assert "arn:aws:s3:::spotrelay-jobs/checkpoints/job-old/*" in statements["Checkpoints"]["Resource"]
    listing = statements["ListSpecCheckpoints"]
    assert listing["Resource"] == "arn:aws:s3:::spotrelay-jobs"
    assert listing["Condition"] == {"StringLike": {"s3:prefix": ["checkpoints/job-old/*"]}}
