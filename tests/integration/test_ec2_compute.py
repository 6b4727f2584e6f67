"""EC2 compute adapter: capacity and quota errors, partial fleets (botocore Stubber, since moto
never runs out of capacity), and the launch/tag/list/terminate path against moto's server."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.stub import ANY, Stubber

from spotrelay.adapters.ec2_compute import Ec2Compute, Ec2ComputeConfig, efa_interfaces, placement_group_name
from spotrelay.domain.models import Pool
from spotrelay.errors import InsufficientCapacityError, QuotaExceededError
from spotrelay.ports.compute import LaunchRequest

POOL = Pool(region="us-east-1", az="us-east-1a", instance_type="p5.48xlarge", market="spot")
CONFIG = Ec2ComputeConfig(image_ids={"us-east-1": "ami-12345678"}, subnet_ids={"us-east-1a": "subnet-1"},
                          security_group_ids={"us-east-1": ["sg-1"]})


def request(count: int = 3, attempt: int = 1) -> LaunchRequest:
    return LaunchRequest(job_id="llm-1", attempt=attempt, pool=POOL, count=count, ranks=list(range(count)),
                         user_data="#!/bin/bash\necho agent")


@pytest.fixture
def stubbed() -> Iterator[tuple[Ec2Compute, Stubber]]:
    ec2 = boto3.client("ec2", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x",
                       endpoint_url="https://ec2.us-east-1.amazonaws.com")
    with Stubber(ec2) as stub:
        yield Ec2Compute(CONFIG, client_factory=lambda service, region=None: ec2), stub
        stub.assert_no_pending_responses()


def expect_launch_prelude(stub: Stubber) -> None:
    stub.add_response("describe_instances", {"Reservations": []})  # nothing launched yet
    stub.add_response("create_placement_group", {}, {
        "GroupName": "spotrelay-llm-1-us-east-1a", "Strategy": "cluster", "TagSpecifications": ANY})
    data = {"ImageId": "ami-12345678", "NetworkInterfaces": efa_interfaces("p5.48xlarge", "subnet-1", ["sg-1"]),
            "MetadataOptions": {"HttpTokens": "required", "HttpPutResponseHopLimit": 2,
                                "InstanceMetadataTags": "enabled"},
            "UserData": base64.b64encode(b"#!/bin/bash\necho agent").decode()}
    stub.add_response("create_launch_template", {"LaunchTemplate": {"LaunchTemplateName": "spotrelay-llm-1"}},
                      {"LaunchTemplateName": ANY, "LaunchTemplateData": data, "TagSpecifications": [
                          {"ResourceType": "launch-template",
                           "Tags": [{"Key": "spotrelay:job-id", "Value": "llm-1"}]}]})


def fleet_args() -> dict[str, Any]:
    return {"Type": "instant", "LaunchTemplateConfigs": [{
        "LaunchTemplateSpecification": {"LaunchTemplateName": ANY, "Version": "$Latest"},
        "Overrides": [{"InstanceType": "p5.48xlarge", "AvailabilityZone": "us-east-1a",
                       "Placement": {"GroupName": "spotrelay-llm-1-us-east-1a"}}]}],
        "TargetCapacitySpecification": {"TotalTargetCapacity": 3, "DefaultTargetCapacityType": "spot"},
        "SpotOptions": {"AllocationStrategy": "capacity-optimized", "SingleInstanceType": True,
                        "SingleAvailabilityZone": True, "MinTargetCapacity": 3},
        "TagSpecifications": ANY}


def test_capacity_errors_in_the_fleet_answer_become_insufficient_capacity(stubbed: tuple[Ec2Compute, Stubber]) -> None:
    compute, stub = stubbed
    expect_launch_prelude(stub)
    stub.add_response("create_fleet", {"FleetId": "fleet-1", "Instances": [], "Errors": [
        {"ErrorCode": "InsufficientInstanceCapacity", "ErrorMessage": "no p5 in us-east-1a"}]}, fleet_args())
    stub.add_response("delete_launch_template", {}, {"LaunchTemplateName": ANY})
    with pytest.raises(InsufficientCapacityError, match="InsufficientInstanceCapacity"):
        compute.launch(request())


def test_a_partial_fleet_is_terminated_and_reported_as_no_capacity(stubbed: tuple[Ec2Compute, Stubber]) -> None:
    compute, stub = stubbed
    expect_launch_prelude(stub)
    stub.add_response("create_fleet", {"FleetId": "fleet-1", "Instances": [
        {"InstanceIds": ["i-1", "i-2"], "InstanceType": "p5.48xlarge", "Lifecycle": "spot"}],
        "Errors": [{"ErrorCode": "InsufficientInstanceCapacity", "ErrorMessage": "1 short"}]}, fleet_args())
    stub.add_response("delete_launch_template", {}, {"LaunchTemplateName": ANY})
    stub.add_response("terminate_instances", {"TerminatingInstances": []}, {"InstanceIds": ["i-1", "i-2"]})
    with pytest.raises(InsufficientCapacityError, match="got 2 of 3"):
        compute.launch(request())


@pytest.mark.parametrize("code", ["VcpuLimitExceeded", "MaxSpotInstanceCountExceeded"])
def test_limits_become_quota_errors(stubbed: tuple[Ec2Compute, Stubber], code: str) -> None:
    compute, stub = stubbed
    expect_launch_prelude(stub)
    stub.add_response("create_fleet", {"FleetId": "f", "Instances": [], "Errors": [
        {"ErrorCode": code, "ErrorMessage": "limit"}]}, fleet_args())
    stub.add_response("delete_launch_template", {}, {"LaunchTemplateName": ANY})
    with pytest.raises(QuotaExceededError, match=code):
        compute.launch(request())


@pytest.mark.parametrize(("code", "error"), [
    ("InsufficientInstanceCapacity", InsufficientCapacityError),
    ("VcpuLimitExceeded", QuotaExceededError),
])
def test_client_errors_are_translated(stubbed: tuple[Ec2Compute, Stubber], code: str, error: type) -> None:
    compute, stub = stubbed
    expect_launch_prelude(stub)
    stub.add_client_error("create_fleet", service_error_code=code, service_message="nope")
    stub.add_response("delete_launch_template", {}, {"LaunchTemplateName": ANY})
    with pytest.raises(error):
        compute.launch(request())


def test_unknown_errors_are_re_raised(stubbed: tuple[Ec2Compute, Stubber]) -> None:
    from botocore.exceptions import ClientError

    compute, stub = stubbed
    expect_launch_prelude(stub)
    stub.add_client_error("create_fleet", service_error_code="InvalidParameterValue", service_message="bad")
    stub.add_response("delete_launch_template", {}, {"LaunchTemplateName": ANY})
    with pytest.raises(ClientError, match="InvalidParameterValue"):
        compute.launch(request())


def test_nothing_to_launch_calls_nothing(stubbed: tuple[Ec2Compute, Stubber]) -> None:
    compute, _ = stubbed  # the stubber fails on any call
    assert compute.launch(request(count=0)) == []
    with pytest.raises(ValueError, match="ranks"):
        compute.launch(LaunchRequest(job_id="j", attempt=1, pool=POOL, count=2, ranks=[0]))


@pytest.mark.parametrize(("code", "taken"), [
    ("Server.SpotInstanceTermination", True), ("Server.SpotInstanceShutdown", True),
    ("Client.UserInitiatedShutdown", False), ("Server.InternalError", False), (None, False)])
def test_spot_reclaimed_reads_the_state_reason(stubbed: tuple[Ec2Compute, Stubber], code: str | None,
                                               taken: bool) -> None:
    compute, stub = stubbed
    raw: dict[str, Any] = {"InstanceId": "i-0123456789abcdef0", "InstanceLifecycle": "spot",
                           "State": {"Code": 48, "Name": "terminated"}}
    if code is not None:
        raw["StateReason"] = {"Code": code, "Message": f"{code}: test"}
    stub.add_response("describe_instances", {"Reservations": [{"Instances": [raw]}]},
                      {"InstanceIds": ["i-0123456789abcdef0"]})
    assert compute.spot_reclaimed("i-0123456789abcdef0", "us-east-1") is taken


def test_spot_reclaimed_is_false_when_ec2_cannot_say(stubbed: tuple[Ec2Compute, Stubber]) -> None:
    compute, stub = stubbed  # gone from EC2's records (about an hour after it ended), or any error
    stub.add_client_error("describe_instances", service_error_code="InvalidInstanceID.NotFound",
                          service_message="gone")
    assert compute.spot_reclaimed("i-0123456789abcdef0", "us-east-1") is False


def test_efa_layout_follows_network_cards() -> None:
    p5 = efa_interfaces("p5.48xlarge", "subnet-1", ["sg-1"])
    assert len(p5) == 32 and all(n["InterfaceType"] == "efa" for n in p5)
    assert [(n["NetworkCardIndex"], n["DeviceIndex"]) for n in p5[:2]] == [(0, 0), (1, 1)]
    assert len(efa_interfaces("p4d.24xlarge", "subnet-1", ["sg-1"])) == 4


# --- against moto's server ------------------------------------------------------------------------
class PlacementGroupsOnTop:
    """moto 5.2 has no placement-group API: this forwards every call to moto's client and keeps
    placement groups in a dict with AWS's semantics (duplicate error, tag filter)."""

    def __init__(self, ec2: Any) -> None:
        self._ec2 = ec2
        self.groups: dict[str, dict[str, Any]] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ec2, name)

    def create_placement_group(self, GroupName: str, Strategy: str, TagSpecifications: Any) -> dict[str, Any]:
        from botocore.exceptions import ClientError

        if GroupName in self.groups:
            raise ClientError({"Error": {"Code": "InvalidPlacementGroup.Duplicate"}}, "CreatePlacementGroup")
        self.groups[GroupName] = {"GroupName": GroupName, "Strategy": Strategy,
                                  "Tags": TagSpecifications[0]["Tags"]}
        return {}

    def describe_placement_groups(self, Filters: list[dict[str, Any]]) -> dict[str, Any]:
        (f,) = Filters
        key = f["Name"].removeprefix("tag:")
        return {"PlacementGroups": [g for g in self.groups.values()
                                    if any(t["Key"] == key and t["Value"] in f["Values"] for t in g["Tags"])]}

    def delete_placement_group(self, GroupName: str) -> dict[str, Any]:
        del self.groups[GroupName]
        return {}


def moto_compute() -> tuple[Ec2Compute, PlacementGroupsOnTop]:
    from spotrelay.adapters.aws import client

    ec2 = PlacementGroupsOnTop(client("ec2", "us-east-1"))
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    role = [{"Key": "spotrelay:role", "Value": "training"}]
    ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.1.0/24", AvailabilityZone="us-east-1a",
                      TagSpecifications=[{"ResourceType": "subnet", "Tags": role}])
    ec2.create_security_group(GroupName="nodes", Description="nodes", VpcId=vpc,
                              TagSpecifications=[{"ResourceType": "security-group", "Tags": role}])
    # moto does not check AMI ids; subnet and security group are found by their tag
    config = Ec2ComputeConfig(image_ids={"us-east-1": "ami-12345678"})
    return Ec2Compute(config, client_factory=lambda service, region=None: ec2), ec2


def test_launch_tags_ranks_lists_and_terminates_by_job(aws: dict[str, str]) -> None:
    compute, ec2 = moto_compute()
    gang = compute.launch(request(count=3))
    assert [i.rank for i in gang] == [0, 1, 2] and len({i.instance_id for i in gang}) == 3
    assert all(i.job_id == "llm-1" and i.attempt == 1 and i.pool == POOL for i in gang)
    again = compute.launch(request(count=3))  # a retried call returns the same gang
    assert [(i.instance_id, i.rank) for i in again] == [(i.instance_id, i.rank) for i in gang]
    # replacement ranks of a later attempt join the same per-job placement group
    extra = compute.launch(LaunchRequest(job_id="llm-1", attempt=2, pool=POOL, count=1, ranks=[1]))
    assert list(ec2.groups) == [placement_group_name("llm-1", "us-east-1a")]
    assert ec2.describe_launch_templates()["LaunchTemplates"] == []  # per-launch templates are removed

    listed = {i.instance_id: i for i in compute.list_tagged(["us-east-1"])}
    assert set(listed) == {i.instance_id for i in [*gang, *extra]}
    assert {(i.rank, i.attempt) for i in listed.values()} == {(0, 1), (1, 1), (2, 1), (1, 2)}
    assert all(i.pool.market == "spot" for i in listed.values())

    compute.terminate([gang[0].instance_id, "i-0123456789abcdef0"], "us-east-1")  # one already gone
    assert gang[0].instance_id not in {i.instance_id for i in compute.list_tagged(["us-east-1"])}
    assert compute.spot_reclaimed(gang[0].instance_id, "us-east-1") is False  # we terminated it: not EC2's
    killed = compute.terminate_job("llm-1", ["us-east-1"])
    assert set(killed) == {gang[1].instance_id, gang[2].instance_id, extra[0].instance_id}
    assert compute.list_tagged(["us-east-1"]) == []
    assert ec2.groups == {}



def test_each_node_is_tagged_with_its_gangs_size_which_the_agent_reads_as_nodes(aws: dict[str, str]) -> None:
    """A shrunk gang (resources.min_nodes) or a replacement rank trains in a gang of ``gang`` nodes, not the
    spec's: the agent learns it from the spotrelay:nodes tag (agent.md). Untagged, it ran torchrun with the
    spec's --nnodes and waited for nodes that were never launched."""
    from agent.config import from_tags

    compute, ec2 = moto_compute()
    (node,) = compute.launch(LaunchRequest(job_id="llm-1", attempt=2, pool=POOL, count=1, ranks=[3], gang=8))
    raw = ec2.describe_instances(InstanceIds=[node.instance_id])["Reservations"][0]["Instances"][0]
    tags = {t["Key"]: t["Value"] for t in raw["Tags"]}
    assert tags["spotrelay:nodes"] == "8" and from_tags(tags)["nodes"] == "8"
    gang = compute.launch(request(count=3, attempt=3))  # no gang named: the launch is the whole gang
    raw = ec2.describe_instances(InstanceIds=[gang[0].instance_id])["Reservations"][0]["Instances"][0]
    assert {t["Key"]: t["Value"] for t in raw["Tags"]}["spotrelay:nodes"] == "3"

def test_settings_come_from_the_stacks_ssm_parameters_and_base_template(aws: dict[str, str]) -> None:
    from spotrelay.adapters.aws import client

    ec2, ssm = PlacementGroupsOnTop(client("ec2", "us-east-1")), client("ssm", "us-east-1")
    vpc = ec2.create_vpc(CidrBlock="10.1.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.1.2.0/24", AvailabilityZone="us-east-1a")["Subnet"]
    group = ec2.create_security_group(GroupName="members", Description="m", VpcId=vpc)["GroupId"]
    template = ec2.create_launch_template(LaunchTemplateName="spotrelay-agent", LaunchTemplateData={
        "ImageId": "ami-0base0000", "UserData": base64.b64encode(b"#!/bin/bash\nbase").decode(),
        "MetadataOptions": {"HttpTokens": "required", "HttpPutResponseHopLimit": 2},
        "BlockDeviceMappings": [{"DeviceName": "/dev/sda1", "Ebs": {"VolumeSize": 500, "VolumeType": "gp3"}}],
    })["LaunchTemplate"]["LaunchTemplateId"]
    for key, value in {"subnets": subnet["SubnetId"], "security-group": group, "launch-template": template,
                       "instance-profile": "arn:aws:iam::123456789012:instance-profile/agent",
                       "fsx-dns": "fs-0123.fsx.us-east-1.amazonaws.com", "fsx-mount-name": "abcd1234"}.items():
        ssm.put_parameter(Name=f"/spotrelay/training/{key}", Value=value, Type="String")
    clients = {"ec2": ec2, "ssm": ssm}
    compute = Ec2Compute(Ec2ComputeConfig(ssm_prefix="/spotrelay/training"),
                         client_factory=lambda service, region=None: clients[service])

    (node,) = compute.launch(LaunchRequest(job_id="j2", attempt=1, pool=POOL, count=1, ranks=[0]))
    raw = ec2.describe_instances(InstanceIds=[node.instance_id])["Reservations"][0]["Instances"][0]
    assert raw["ImageId"] == "ami-0base0000"  # from the stack's template
    tags = {t["Key"]: t["Value"] for t in raw["Tags"]}
    assert tags["spotrelay:job"] == tags["spotrelay:job-id"] == "j2" and tags["spotrelay:rank"] == "0"
    # the region's FSx, as the agent mounts it (agent/fsx.py reads it as its fsx_source field)
    assert tags["spotrelay:fsx-source"] == "fs-0123.fsx.us-east-1.amazonaws.com@tcp:/abcd1234"
    from agent.config import from_tags
    assert from_tags(tags)["fsx_source"] == tags["spotrelay:fsx-source"]
    data = ec2.describe_instance_attribute(InstanceId=node.instance_id, Attribute="userData")["UserData"]["Value"]
    assert base64.b64decode(data) == b"#!/bin/bash\nbase"  # no user data in the request: the stack's
    (other,) = compute.launch(LaunchRequest(job_id="j2", attempt=2, pool=POOL, count=1, ranks=[0],
                                            user_data="#!/bin/bash\nmine"))
    data = ec2.describe_instance_attribute(InstanceId=other.instance_id, Attribute="userData")["UserData"]["Value"]
    assert base64.b64decode(data) == b"#!/bin/bash\nmine"
    templates = [t["LaunchTemplateName"] for t in ec2.describe_launch_templates()["LaunchTemplates"]]
    assert templates == ["spotrelay-agent"]  # the per-launch ones are gone, the stack's stays
