"""Where a region's training nodes go: subnets per AZ, security groups, AMI, instance profile and the
launch template data to start from. Resolved once per region and cached by the compute adapter.

Each item comes from the first source that has it:

1. ``Ec2ComputeConfig`` (explicit ids; JSON in ``SPOTRELAY_EC2_CONFIG`` for the Lambdas);
2. the SSM parameters the CDK training-region stack writes under ``ssm_prefix``
   (``subnets``, ``security-group``, ``instance-profile``, ``launch-template``), and the data of that
   launch template's ``$Latest`` version (AMI, profile, root volume, IMDS options, user data);
3. resources tagged ``role_tag`` (``spotrelay:role=training``): subnets, security groups, AMIs.

With ``job_profiles`` set (the CDK app sets it), the instance profile found here is not used: each
job gets its own (``iam_job_profile``).
"""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError
from pydantic import BaseModel, ConfigDict, Field

from spotrelay.adapters.aws import error_code
from spotrelay.adapters.iam_job_profile import JobProfileConfig


class Ec2ComputeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    image_ids: dict[str, str] = Field(default_factory=dict, description="region -> AMI id")
    subnet_ids: dict[str, str] = Field(default_factory=dict, description="AZ -> subnet id")
    security_group_ids: dict[str, list[str]] = Field(default_factory=dict, description="region -> ids")
    instance_profile_arn: str | None = None
    base_launch_templates: dict[str, str] = Field(default_factory=dict, description="region -> id or name")
    ssm_prefix: str | None = Field(None, description="e.g. /spotrelay/training (the CDK stack's parameters)")
    role_tag: tuple[str, str] = ("spotrelay:role", "training")
    # set: each job launches with its own role/profile (iam_job_profile), never instance_profile_arn
    job_profiles: JobProfileConfig | None = None


class RegionSetup(BaseModel):
    model_config = ConfigDict(extra="forbid")
    subnets: dict[str, str]  # AZ -> subnet id
    security_groups: list[str]
    image_id: str | None
    instance_profile_arn: str | None
    base_data: dict[str, Any]  # launch template data to start each launch from
    # the region's FSx for Lustre as mount names it (``<dns>@tcp:/<mount name>``), when the stack made one
    fsx_source: str | None = None


def _ssm(ssm: Any, prefix: str | None) -> dict[str, str]:
    if not prefix:
        return {}
    names = [f"{prefix.rstrip('/')}/{k}" for k in ("subnets", "security-group", "instance-profile",
                                                    "launch-template", "fsx-dns", "fsx-mount-name")]
    answer = ssm.get_parameters(Names=names)
    return {p["Name"].rsplit("/", 1)[-1]: p["Value"] for p in answer.get("Parameters", [])}


def _base_data(ec2: Any, template: str | None) -> dict[str, Any]:
    if not template:
        return {}
    key = {"LaunchTemplateId": template} if template.startswith("lt-") else {"LaunchTemplateName": template}
    try:
        versions = ec2.describe_launch_template_versions(**key, Versions=["$Latest"])["LaunchTemplateVersions"]
    except ClientError as exc:
        if error_code(exc).startswith("InvalidLaunchTemplate"):
            raise ValueError(f"base launch template {template} not found") from exc
        raise
    return dict(versions[0].get("LaunchTemplateData", {})) if versions else {}


def _role_filter(config: Ec2ComputeConfig) -> dict[str, Any]:
    key, value = config.role_tag
    return {"Name": f"tag:{key}", "Values": [value]}


def _subnets(ec2: Any, config: Ec2ComputeConfig, region: str, listed: str | None) -> dict[str, str]:
    explicit = {az: s for az, s in config.subnet_ids.items() if az.startswith(region)}
    if explicit:
        return explicit
    kwargs: dict[str, Any] = (
        {"SubnetIds": [s.strip() for s in listed.split(",") if s.strip()]} if listed
        else {"Filters": [_role_filter(config)]}
    )
    found: dict[str, str] = {}
    for subnet in ec2.describe_subnets(**kwargs).get("Subnets", []):
        found.setdefault(subnet["AvailabilityZone"], subnet["SubnetId"])
    return found


def _groups(ec2: Any, config: Ec2ComputeConfig, region: str, listed: str | None, base: dict[str, Any]) -> list[str]:
    if region in config.security_group_ids:
        return config.security_group_ids[region]
    if listed:
        return [g.strip() for g in listed.split(",") if g.strip()]
    from_base = [g for ni in base.get("NetworkInterfaces", []) for g in ni.get("Groups", [])]
    if from_base or base.get("SecurityGroupIds"):
        return sorted(set(from_base) | set(base.get("SecurityGroupIds", [])))
    found = ec2.describe_security_groups(Filters=[_role_filter(config)]).get("SecurityGroups", [])
    return [str(g["GroupId"]) for g in found]


def _image(ec2: Any, config: Ec2ComputeConfig, region: str, base: dict[str, Any]) -> str | None:
    if region in config.image_ids:
        return config.image_ids[region]
    if base.get("ImageId"):
        return str(base["ImageId"])
    images = ec2.describe_images(Owners=["self"], Filters=[_role_filter(config)]).get("Images", [])
    return str(max(images, key=lambda i: i.get("CreationDate", ""))["ImageId"]) if images else None


def resolve_region(config: Ec2ComputeConfig, region: str, ec2: Any, ssm: Any) -> RegionSetup:
    params = _ssm(ssm, config.ssm_prefix)
    base = _base_data(ec2, config.base_launch_templates.get(region) or params.get("launch-template"))
    profile = (config.instance_profile_arn or params.get("instance-profile")
               or base.get("IamInstanceProfile", {}).get("Arn"))
    return RegionSetup(
        subnets=_subnets(ec2, config, region, params.get("subnets")),
        security_groups=_groups(ec2, config, region, params.get("security-group"), base),
        image_id=_image(ec2, config, region, base), instance_profile_arn=profile, base_data=base,
        fsx_source=_fsx_source(params),
    )


def _fsx_source(params: dict[str, str]) -> str | None:
    dns, name = params.get("fsx-dns"), params.get("fsx-mount-name")
    return f"{dns}@tcp:/{name}" if dns and name else None
