"""Compute on EC2: gang launches with CreateFleet (type instant), termination by tag.

One launch = one fleet request for ``count`` instances of ONE type in ONE AZ, in a cluster
placement group, all or nothing (``MinTargetCapacity = count``; a partial answer is terminated
anyway). EFA: Fleet overrides cannot carry network interfaces, so each launch writes a short-lived
launch template whose interfaces follow the type's network cards (p5.48xlarge: 32 EFA interfaces,
card 0 device 0 plus cards 1-31 device 1; p4d/p4de.24xlarge: 4), and the Fleet override pins the
instance type, AZ and placement group. The template is deleted once the fleet answered.

The placement group is named per job and AZ (``spotrelay-<job>-<az>``), not per attempt, so the
replacement ranks of ``replace-lost-nodes`` join the survivors' group; ``terminate_job`` removes it.
Subnets, security groups, the AMI, the instance profile and the launch template data to start from
(root volume, IMDS options, default user data) are resolved per region by ``ec2_discovery``:
explicit config, else the CDK stack's SSM parameters, else resources tagged ``spotrelay:role=training``.
With ``job_profiles`` configured, each job launches with its own instance profile instead
(``iam_job_profile``: only its checkpoints, its spec, its table items); ``terminate_job`` deletes it.
A launch refused because that fresh profile has not yet propagated is retried a few times within the
call (``PROFILE_RETRY_DELAYS``, about 14 s), then raised as ``RetryableError``.
Instances carry ``spotrelay:job`` and ``spotrelay:job-id`` (the tag the controller's IAM policy
requires on everything it creates), ``spotrelay:attempt``, ``spotrelay:pool``, ``spotrelay:nodes`` (the
gang's size) and, per instance, ``spotrelay:rank``; IMDS exposes them to the agent
(``InstanceMetadataTags`` is always enabled).
"""

from __future__ import annotations

import base64
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from spotrelay.adapters.aws import client, error_code
from spotrelay.adapters.ec2_discovery import Ec2ComputeConfig, RegionSetup, resolve_region
from spotrelay.adapters.iam_job_profile import JobProfiles
from spotrelay.domain.models import Pool
from spotrelay.errors import InsufficientCapacityError, QuotaExceededError, RetryableError
from spotrelay.placement import catalog
from spotrelay.ports.compute import Instance, LaunchRequest
from spotrelay.recovery.boot import ec2_boot_seconds

__all__ = ["Ec2Compute", "Ec2ComputeConfig", "efa_interfaces", "placement_group_name"]

TAG_JOB, TAG_ATTEMPT, TAG_RANK = "spotrelay:job", "spotrelay:attempt", "spotrelay:rank"
TAG_NODES = "spotrelay:nodes"
TAG_FSX_SOURCE = "spotrelay:fsx-source"  # agent config field fsx_source, read from the tags
TAG_JOB_ID = "spotrelay:job-id"  # the tag the controller's IAM conditions check (cdk/permissions.py)
_BASE_KEYS = ("BlockDeviceMappings", "Monitoring", "TagSpecifications", "UserData", "KeyName", "EbsOptimized")
_METADATA_KEYS = ("HttpTokens", "HttpPutResponseHopLimit", "HttpEndpoint", "HttpProtocolIpv6")
LIVE_STATES = ["pending", "running", "stopping", "stopped"]
CAPACITY_CODES = {
    "InsufficientInstanceCapacity", "InsufficientCapacity", "UnfulfillableCapacity",
    "InsufficientHostCapacity", "InsufficientReservedInstanceCapacity", "SpotMaxPriceTooLow",
}
# DescribeInstances' StateReason.Code when EC2 interrupts a spot instance (terminate, or stop/hibernate)
SPOT_INTERRUPTION_CODES = frozenset({"Server.SpotInstanceTermination", "Server.SpotInstanceShutdown"})
QUOTA_CODES = {"VcpuLimitExceeded", "MaxSpotInstanceCountExceeded", "InstanceLimitExceeded",
               "MaxSpotFleetRequestCountExceeded"}

log = logging.getLogger(__name__)
ClientFactory = Callable[..., Any]
# IAM is eventually consistent; EC2 usually sees a new instance profile within ~10 s
PROFILE_RETRY_DELAYS = (2.0, 4.0, 8.0)


def efa_interfaces(instance_type: str, subnet_id: str, groups: list[str]) -> list[dict[str, Any]]:
    """One EFA interface per network card; card 0 is the primary (device 0)."""
    info = catalog.instance(instance_type)
    cards = info.efa_interfaces if info else 1
    return [
        {"NetworkCardIndex": card, "DeviceIndex": 0 if card == 0 else 1, "InterfaceType": "efa",
         "SubnetId": subnet_id, "Groups": groups, "DeleteOnTermination": True}
        for card in range(cards)
    ]


def placement_group_name(job_id: str, az: str) -> str:
    return f"spotrelay-{job_id}-{az}"[:255]


def _profile_not_ready(message: str) -> bool:
    # IAM is eventually consistent: EC2 may not see a just-created instance profile for a few seconds
    return "instanceprofile" in message.lower().replace(" ", "")


def _fleet_error(errors: list[dict[str, Any]], pool: Pool, got: int, wanted: int) -> Exception:
    codes = sorted({str(e.get("ErrorCode", "")) for e in errors})
    detail = "; ".join(f"{e.get('ErrorCode')}: {e.get('ErrorMessage', '')}" for e in errors[:3])
    if errors and all(_profile_not_ready(str(e.get("ErrorMessage", ""))) for e in errors):
        return RetryableError(f"{pool.key}: instance profile not visible to EC2 yet; {detail}")
    if codes and all(c in QUOTA_CODES for c in codes):
        return QuotaExceededError(f"{pool.key}: {detail}")
    return InsufficientCapacityError(f"{pool.key}: got {got} of {wanted} instances; {detail or 'no errors'}")


class Ec2Compute:
    def __init__(self, config: Ec2ComputeConfig | None = None, client_factory: ClientFactory = client,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self._config = config or Ec2ComputeConfig()
        self._client = client_factory
        self._sleep = sleep
        self._setups: dict[str, RegionSetup] = {}  # per region, kept while the Lambda stays warm
        self._job_profiles: JobProfiles | None = None

    def _profiles(self) -> JobProfiles | None:
        if self._config.job_profiles is None:
            return None
        if self._job_profiles is None:
            self._job_profiles = JobProfiles(self._config.job_profiles, self._client("iam"))
        return self._job_profiles

    def _setup(self, region: str) -> RegionSetup:
        if region not in self._setups:
            ssm = self._client("ssm", region) if self._config.ssm_prefix else None
            self._setups[region] = resolve_region(self._config, region, self._client("ec2", region), ssm)
        return self._setups[region]

    # --- launch --------------------------------------------------------------------------------
    def launch(self, request: LaunchRequest) -> list[Instance]:
        if len(request.ranks) != request.count:
            raise ValueError(f"{request.count} instances need {request.count} ranks, got {request.ranks}")
        if request.count == 0:  # a restart in place launches nothing
            return []
        pool = request.pool
        ec2 = self._client("ec2", pool.region)
        existing = self._already_launched(ec2, request)
        if existing:  # a retried call: the gang is already there
            return existing
        profiles = self._profiles()
        profile = profiles.ensure(request.job_id, request.config_uri, request.checkpoint_prefix,
                                   request.dataset_uris) if profiles else None
        group = self._ensure_placement_group(ec2, request.job_id, pool.az)
        template = self._create_template(ec2, request, profile)
        try:
            response = self._create_fleet(ec2, self._fleet_args(request, template, group), pool, profile)
        finally:
            self._delete_template(ec2, template)
        ids = [i for item in response.get("Instances", []) for i in item.get("InstanceIds", [])]
        if len(ids) < request.count:
            if ids:  # partial capacity is released, never kept
                ec2.terminate_instances(InstanceIds=ids)
            raise _fleet_error(response.get("Errors", []), pool, len(ids), request.count)
        ids = ids[: request.count]
        for instance_id, rank in zip(ids, request.ranks, strict=True):
            ec2.create_tags(Resources=[instance_id], Tags=[
                {"Key": TAG_RANK, "Value": str(rank)},
                {"Key": "Name", "Value": f"{request.job_id}-a{request.attempt}-r{rank}"},
            ])
        ips = self._private_ips(ec2, ids)
        return [
            Instance(instance_id=i, pool=pool, rank=r, private_ip=ips.get(i), job_id=request.job_id,
                     attempt=request.attempt)
            for i, r in zip(ids, request.ranks, strict=True)
        ]

    def _create_fleet(self, ec2: Any, args: dict[str, Any], pool: Pool, profile: str | None) -> dict[str, Any]:
        for delay in (*PROFILE_RETRY_DELAYS, None):
            try:
                response: dict[str, Any] = ec2.create_fleet(**args)
            except ClientError as exc:
                code = error_code(exc)
                if code in CAPACITY_CODES:
                    raise InsufficientCapacityError(f"{pool.key}: {code}") from exc
                if code in QUOTA_CODES:
                    raise QuotaExceededError(f"{pool.key}: {code}") from exc
                if not (profile and code.startswith("InvalidParameter") and _profile_not_ready(str(exc))):
                    raise
                if delay is None:
                    raise RetryableError(f"{pool.key}: instance profile not visible to EC2 yet ({code})") from exc
            else:
                errors = response.get("Errors", [])
                not_ready = (profile and not response.get("Instances") and errors
                             and all(_profile_not_ready(str(e.get("ErrorMessage", ""))) for e in errors))
                if not not_ready or delay is None:
                    return response  # a still-unready profile becomes RetryableError in _fleet_error
            self._sleep(delay)
        raise AssertionError("unreachable")

    def _fleet_args(self, request: LaunchRequest, template: str, group: str) -> dict[str, Any]:
        pool, n = request.pool, request.count
        market = "spot" if pool.market == "spot" else "on-demand"
        tags = [{"Key": TAG_JOB, "Value": request.job_id}, {"Key": TAG_JOB_ID, "Value": request.job_id},
                {"Key": TAG_ATTEMPT, "Value": str(request.attempt)}, {"Key": "spotrelay:pool", "Value": pool.key},
                # the gang it trains in (agent config field nodes): a shrunk gang's or a replacement's is not the spec's
                {"Key": TAG_NODES, "Value": str(request.gang or request.count)}]
        if request.config_uri:
            tags.append({"Key": "spotrelay:config-uri", "Value": request.config_uri[:256]})
        fsx = self._setup(pool.region).fsx_source
        if fsx:  # the agent mounts it where the spec's dataset.fsx says (agent/fsx.py)
            tags.append({"Key": TAG_FSX_SOURCE, "Value": fsx})
        # all or nothing: MinTargetCapacity needs single type and single AZ (instant fleets only)
        single = {"SingleInstanceType": True, "SingleAvailabilityZone": True, "MinTargetCapacity": n}
        options = ({"SpotOptions": {"AllocationStrategy": "capacity-optimized", **single}} if market == "spot"
                   else {"OnDemandOptions": {"AllocationStrategy": "lowest-price", **single}})
        return {
            "Type": "instant",
            "LaunchTemplateConfigs": [{
                "LaunchTemplateSpecification": {"LaunchTemplateName": template, "Version": "$Latest"},
                "Overrides": [{"InstanceType": pool.instance_type, "AvailabilityZone": pool.az,
                               "Placement": {"GroupName": group}}],
            }],
            "TargetCapacitySpecification": {"TotalTargetCapacity": n, "DefaultTargetCapacityType": market},
            **options,
            "TagSpecifications": [{"ResourceType": "instance", "Tags": tags},
                                  {"ResourceType": "fleet", "Tags": tags}],
        }

    def _create_template(self, ec2: Any, request: LaunchRequest, profile: str | None = None) -> str:
        pool, setup = request.pool, self._setup(request.pool.region)
        subnet = setup.subnets.get(pool.az)
        if subnet is None:  # this pool cannot be used; the workflow moves on to the next one
            raise InsufficientCapacityError(f"{pool.key}: no training subnet in {pool.az}")
        if setup.image_id is None:
            raise ValueError(f"no AMI for {pool.region}: set image_ids, ssm_prefix or tag an image")
        base = setup.base_data
        data: dict[str, Any] = {k: base[k] for k in _BASE_KEYS if k in base}
        metadata = {k: v for k, v in base.get("MetadataOptions", {}).items() if k in _METADATA_KEYS}
        data["MetadataOptions"] = {"HttpTokens": "required", "HttpPutResponseHopLimit": 2, **metadata,
                                   "InstanceMetadataTags": "enabled"}  # the agent reads its tags
        data["ImageId"] = setup.image_id
        data["NetworkInterfaces"] = efa_interfaces(pool.instance_type, subnet, setup.security_groups)
        if request.user_data:
            data["UserData"] = base64.b64encode(request.user_data.encode()).decode()
        if profile or setup.instance_profile_arn:
            data["IamInstanceProfile"] = {"Arn": profile or setup.instance_profile_arn}
        name = f"spotrelay-{request.job_id}-a{request.attempt}-{uuid.uuid4().hex[:8]}"[:128]
        ec2.create_launch_template(LaunchTemplateName=name, LaunchTemplateData=data, TagSpecifications=[
            {"ResourceType": "launch-template", "Tags": [{"Key": TAG_JOB_ID, "Value": request.job_id}]}])
        return name

    @staticmethod
    def _delete_template(ec2: Any, name: str) -> None:
        with contextlib.suppress(ClientError):  # a leftover template costs nothing
            ec2.delete_launch_template(LaunchTemplateName=name)

    def _ensure_placement_group(self, ec2: Any, job_id: str, az: str) -> str:
        name = placement_group_name(job_id, az)
        try:
            ec2.create_placement_group(GroupName=name, Strategy="cluster", TagSpecifications=[
                {"ResourceType": "placement-group", "Tags": [{"Key": TAG_JOB, "Value": job_id},
                                                             {"Key": TAG_JOB_ID, "Value": job_id}]}])
        except ClientError as exc:
            if error_code(exc) != "InvalidPlacementGroup.Duplicate":
                raise
        return name

    def _already_launched(self, ec2: Any, request: LaunchRequest) -> list[Instance]:
        found = [
            i for i in self._describe(ec2, request.pool.region, [
                {"Name": f"tag:{TAG_JOB}", "Values": [request.job_id]},
                {"Name": f"tag:{TAG_ATTEMPT}", "Values": [str(request.attempt)]},
                {"Name": "tag:spotrelay:pool", "Values": [request.pool.key]},
            ]) if i.rank in request.ranks
        ]
        return sorted(found, key=lambda i: request.ranks.index(i.rank)) if len(found) == request.count else []

    def expected_boot_s(self, pool: Pool) -> float:
        return ec2_boot_seconds(pool.instance_type)

    # --- termination and listing ---------------------------------------------------------------
    def terminate(self, instance_ids: list[str], region: str) -> None:
        if not instance_ids:
            return
        ec2 = self._client("ec2", region)
        try:
            ec2.terminate_instances(InstanceIds=instance_ids)
        except ClientError as exc:
            if error_code(exc) != "InvalidInstanceID.NotFound":
                raise
            if len(instance_ids) > 1:  # some are already gone: terminate the rest one by one
                for one in instance_ids:
                    self.terminate([one], region)

    def spot_reclaimed(self, instance_id: str, region: str) -> bool:
        """EC2's StateReason for the instance (kept about an hour after it terminates). A failed call
        answers False: the loss is then billed in the ledger as a crash would be, an over-estimate."""
        try:
            reservations = self._client("ec2", region).describe_instances(
                InstanceIds=[instance_id]).get("Reservations", [])
        except (ClientError, BotoCoreError) as exc:
            log.warning("state reason not read", extra={"instance_id": instance_id, "error": str(exc)})
            return False
        return any(raw.get("StateReason", {}).get("Code") in SPOT_INTERRUPTION_CODES
                   for r in reservations for raw in r.get("Instances", []) if raw.get("InstanceId") == instance_id)

    def terminate_job(self, job_id: str, regions: list[str]) -> list[str]:
        ids: list[str] = []
        for region in regions:
            ec2 = self._client("ec2", region)
            mine = [i.instance_id for i in self._describe(ec2, region, [
                {"Name": f"tag:{TAG_JOB}", "Values": [job_id]}])]
            self.terminate(mine, region)
            ids.extend(mine)
            self._delete_placement_groups(ec2, job_id)
        profiles = self._profiles()
        if profiles:  # a shutting-down node keeps its credentials until they expire; that is fine
            profiles.delete(job_id)
        return ids

    @staticmethod
    def _delete_placement_groups(ec2: Any, job_id: str) -> None:
        groups = ec2.describe_placement_groups(Filters=[{"Name": f"tag:{TAG_JOB}", "Values": [job_id]}])
        for group in groups.get("PlacementGroups", []):
            # fails while it still holds shutting-down instances; reconcile's next sweep retries
            with contextlib.suppress(ClientError):
                ec2.delete_placement_group(GroupName=group["GroupName"])

    def job_profiles(self, skip: frozenset[str] = frozenset()) -> list[str]:
        profiles = self._profiles()
        return sorted(profiles.jobs(skip)) if profiles else []

    def delete_job_profile(self, job_id: str) -> None:
        profiles = self._profiles()
        if profiles:
            profiles.delete(job_id)

    def list_tagged(self, regions: list[str]) -> list[Instance]:
        out: list[Instance] = []
        for region in regions:
            out.extend(self._describe(self._client("ec2", region), region,
                                      [{"Name": "tag-key", "Values": [TAG_JOB]}]))
        return out

    def _describe(self, ec2: Any, region: str, filters: list[dict[str, Any]]) -> list[Instance]:
        filters = [*filters, {"Name": "instance-state-name", "Values": LIVE_STATES}]
        out: list[Instance] = []
        for page in ec2.get_paginator("describe_instances").paginate(Filters=filters):
            for reservation in page.get("Reservations", []):
                out.extend(_instance(region, raw) for raw in reservation.get("Instances", []))
        return out

    @staticmethod
    def _private_ips(ec2: Any, ids: list[str]) -> dict[str, str]:
        found: dict[str, str] = {}
        for reservation in ec2.describe_instances(InstanceIds=ids).get("Reservations", []):
            for raw in reservation.get("Instances", []):
                if raw.get("PrivateIpAddress"):
                    found[raw["InstanceId"]] = raw["PrivateIpAddress"]
        return found


def _instance(region: str, raw: dict[str, Any]) -> Instance:
    tags = {t["Key"]: t["Value"] for t in raw.get("Tags", [])}
    market = "spot" if raw.get("InstanceLifecycle") == "spot" else "on-demand"
    pool = Pool(region=region, az=raw.get("Placement", {}).get("AvailabilityZone", ""),
                instance_type=raw.get("InstanceType", ""), market=market)
    attempt = tags.get(TAG_ATTEMPT)
    return Instance(
        instance_id=raw["InstanceId"], pool=pool, rank=int(tags.get(TAG_RANK, "-1")),
        private_ip=raw.get("PrivateIpAddress"), state=raw.get("State", {}).get("Name", "unknown"),
        job_id=tags.get(TAG_JOB), attempt=int(attempt) if attempt and attempt.isdigit() else None,
    )
