"""Template assertions on the training-region stacks."""

from __future__ import annotations

import json
from typing import Any

from spotrelay.contracts.events import AGENT_SOURCE
from spotrelay.resources import FORWARDED_EC2_PATTERNS, RESOURCES
from tests.infrastructure.conftest import Synth


def _remote(synth: Synth) -> list[str]:
    return [name for region, name in synth.training.items() if region != synth.config.home_region]


def test_one_stack_per_training_region_in_its_region(synth: Synth) -> None:
    assert 1 <= len(synth.training) <= 4
    for region, name in synth.training.items():
        assert synth.regions[name] == region
    assert synth.regions[synth.home] == synth.config.home_region


def test_ec2_events_forwarded_to_the_home_bus_with_the_shared_patterns(synth: Synth) -> None:
    home_bus = f":events:{synth.config.home_region}:"
    assert _remote(synth), "the default context trains outside the home region too"
    for name in _remote(synth):
        rules = [r["Properties"] for r in synth.resources(name, "AWS::Events::Rule").values()]
        assert sorted(json.dumps(r["EventPattern"], sort_keys=True) for r in rules) == sorted(
            json.dumps(p, sort_keys=True) for p in FORWARDED_EC2_PATTERNS
        )
        for rule in rules:
            (target,) = rule["Targets"]
            assert home_bus in json.dumps(target["Arn"]) and "event-bus/default" in json.dumps(target["Arn"])
            assert "DeadLetterConfig" in target and target["RetryPolicy"]["MaximumRetryAttempts"] > 0
    # in the home region the home rules already see EC2 events: no forwarding loop onto itself
    home_training = synth.training.get(synth.config.home_region)
    if home_training:
        assert not synth.resources(home_training, "AWS::Events::Rule")


def _launch_template(synth: Synth, name: str) -> dict[str, Any]:
    (lt,) = synth.resources(name, "AWS::EC2::LaunchTemplate").values()
    data: dict[str, Any] = lt["Properties"]["LaunchTemplateData"]
    return data


def test_launch_template_dlami_from_ssm_efa_and_imdsv2(synth: Synth) -> None:
    for name in synth.training.values():
        data = _launch_template(synth, name)
        assert data["MetadataOptions"]["HttpTokens"] == "required"
        assert data["MetadataOptions"]["InstanceMetadataTags"] == "enabled"
        param = synth.template(name)["Parameters"][data["ImageId"]["Ref"]]
        assert param["Type"] == "AWS::SSM::Parameter::Value<AWS::EC2::Image::Id>"
        assert param["Default"].startswith("/aws/service/deeplearning/ami/")
        (nic,) = data["NetworkInterfaces"]
        assert nic["InterfaceType"] == "efa"
        assert all(m["Ebs"]["Encrypted"] for m in data["BlockDeviceMappings"])


def test_security_group_allows_members_only(synth: Synth) -> None:
    for name in synth.training.values():
        groups = synth.resources(name, "AWS::EC2::SecurityGroup")
        (members,) = [k for k, g in groups.items() if "members" in g["Properties"]["GroupDescription"]]
        assert "SecurityGroupIngress" not in groups[members]["Properties"]
        ingress = [
            r["Properties"]
            for r in synth.resources(name, "AWS::EC2::SecurityGroupIngress").values()
            if r["Properties"]["GroupId"] == {"Fn::GetAtt": [members, "GroupId"]}
        ]
        assert ingress == [
            {
                "Description": "members (NCCL/EFA)",
                "GroupId": {"Fn::GetAtt": [members, "GroupId"]},
                "IpProtocol": "-1",
                "SourceSecurityGroupId": {"Fn::GetAtt": [members, "GroupId"]},
            }
        ]


def _role_statements(synth: Synth, name: str, role_name_part: str) -> list[dict[str, Any]]:
    template = synth.template(name)
    roles = [
        k
        for k, r in synth.resources(name, "AWS::IAM::Role").items()
        if role_name_part in json.dumps(r["Properties"].get("RoleName", ""))
    ]
    assert len(roles) == 1
    statements = []
    for res in template["Resources"].values():
        if res["Type"] == "AWS::IAM::Policy" and {"Ref": roles[0]} in res["Properties"]["Roles"]:
            statements.extend(res["Properties"]["PolicyDocument"]["Statement"])
    return statements


def test_agent_role_limited_to_its_paths_and_agent_calls(synth: Synth) -> None:
    for region, name in synth.training.items():
        statements = _role_statements(synth, name, f"-agent-{region}")
        actions = {a for s in statements for a in (s["Action"] if isinstance(s["Action"], list) else [s["Action"]])}
        assert not any(a.startswith(("ec2:", "iam:", "states:", "sns:", "secretsmanager:")) for a in actions)
        put_events = [s for s in statements if s["Action"] == "events:PutEvents"]
        assert put_events and put_events[0]["Condition"] == {"StringEquals": {"events:source": [AGENT_SOURCE]}}
        for statement in statements:
            for resource in (
                statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
            ):
                text = json.dumps(resource)
                if text.endswith('*"]]}') or text.endswith('*"'):
                    datasets = tuple(f":s3:::{b}/*" for b in synth.config.dataset_buckets)  # read only
                    assert any(p in text for p in ("/checkpoints/*", "/data/*", "/artifacts/agent/*", "/code/*",
                                                   "/spotrelay/training:log-stream:*", *datasets)), text
                    assert not any(p in text for p in datasets) or statement["Action"] == "s3:GetObject"
        ddb = [
            s
            for s in statements
            if any(
                str(a).startswith("dynamodb:")
                for a in (s["Action"] if isinstance(s["Action"], list) else [s["Action"]])
            )
        ]
        assert ddb and all(
            "table/spotrelay-nodes" in json.dumps(s["Resource"]) or "table/spotrelay-jobs" in json.dumps(s["Resource"])
            for s in ddb
        )
        # read only: the agent reports events; the controller's handlers write the records
        assert {a for a in actions if a.startswith("dynamodb:")} == {"dynamodb:GetItem", "dynamodb:Query"}


def test_fallback_agent_role_reads_code_archives_like_the_per_job_profiles(synth: Synth) -> None:
    """A node launched by hand must fetch entrypoint.code from code/ of the home jobs bucket, read-only."""
    from spotrelay.resources import RESOURCES

    for region, name in synth.training.items():
        statements = _role_statements(synth, name, f"-agent-{region}")
        code = [s for s in statements if f"/{RESOURCES.code_prefix}*" in json.dumps(s["Resource"])]
        assert code, f"{name}: the fallback role cannot read {RESOURCES.code_prefix}"
        assert all(s["Action"] in ("s3:GetObject", ["s3:GetObject"]) for s in code), code
        assert all("-jobs-" in json.dumps(s["Resource"]) for s in code), code


def test_data_bucket_secure_and_checkpoints_replicated_home(synth: Synth) -> None:
    from tests.infrastructure.test_home_stack import _assert_secure_bucket

    for name in synth.training.values():
        buckets = synth.resources(name, "AWS::S3::Bucket")
        (data,) = [k for k, b in buckets.items() if "ReplicationConfiguration" in b["Properties"]]
        _assert_secure_bucket(synth.template(name), data)
        (rule,) = buckets[data]["Properties"]["ReplicationConfiguration"]["Rules"]
        assert rule["Filter"] == {"Prefix": RESOURCES.checkpoints_prefix} and rule["Status"] == "Enabled"
        destination = json.dumps(rule["Destination"]["Bucket"])
        assert "-jobs-" in destination and f"-{synth.config.home_region}" in destination


def test_fsx_for_lustre_linked_to_the_data_bucket_when_enabled(synth: Synth) -> None:
    assert synth.config.fsx_enabled
    for name in synth.training.values():
        (fs,) = synth.resources(name, "AWS::FSx::FileSystem").values()
        lustre = fs["Properties"]["LustreConfiguration"]
        assert fs["Properties"]["FileSystemType"] == "LUSTRE"
        assert "/data" in json.dumps(lustre["ImportPath"]) and lustre["AutoImportPolicy"] == "NEW_CHANGED_DELETED"


def test_controller_parameters_published(synth: Synth) -> None:
    for name in synth.training.values():
        params = {p["Properties"]["Name"] for p in synth.resources(name, "AWS::SSM::Parameter").values()}
        assert {
            f"/spotrelay/training/{k}"
            for k in ("subnets", "security-group", "launch-template", "instance-profile", "data-bucket", "fsx-dns")
        } <= params


def test_training_stacks_deploy_after_home(synth: Synth) -> None:
    manifest = json.loads((synth.outdir / "manifest.json").read_text())
    for name in synth.training.values():
        assert synth.home in manifest["artifacts"][name].get("dependencies", [])


def test_training_vpc_spans_the_configured_azs(synth: Synth) -> None:
    assert synth.config.availability_zones, "the fixture context sets AZs for one region"
    for region, name in synth.training.items():
        subnets = [s["Properties"] for s in synth.resources(name, "AWS::EC2::Subnet").values()]
        private = [s for s in subnets if not s.get("MapPublicIpOnLaunch")]
        zones = synth.config.availability_zones.get(region)
        if zones:
            assert sorted(s["AvailabilityZone"] for s in private) == sorted(zones)
        else:
            assert len(private) == 2 and all("Fn::GetAZs" in json.dumps(s["AvailabilityZone"]) for s in private)


def test_user_data_installs_the_agent_as_a_systemd_unit(synth: Synth) -> None:
    for name in synth.training.values():
        user_data = json.dumps(_launch_template(synth, name)["UserData"])  # Fn::Base64 of an Fn::Join
        assert "systemctl enable --now spotrelay-agent.service" in user_data
        assert "SPOTRELAY_JOBS_TABLE" in user_data and "SPOTRELAY_EVENT_BUS" in user_data
        assert f"AWS_REGION={synth.config.home_region}" in user_data  # agent calls go home
