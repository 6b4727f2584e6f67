"""Static market table: on-demand prices, Spot Advisor bands, typical spot discounts and instance facts.

Where the numbers come from (all APPROXIMATE, checked by hand, not fetched at run time):

- On-demand USD per instance-hour: the EC2 on-demand pricing pages (Linux), after the June 2025
  price reduction for P4/P5 (P5 about -45%, P4d about -33%). Regions other than the US ones carry a
  small uplift as on the pricing pages. Verify with the Pricing API before trusting a cent.
- Spot Advisor bands: the "frequency of interruption" column of the EC2 Spot Instance Advisor,
  band 0 (<5%), 1 (5-10%), 2 (10-15%), 3 (15-20%), 4 (>20%) over the trailing month. They move weekly.
- Typical spot price: spot sells GPU capacity at roughly 35-45% of on-demand in the regions below;
  the live price comes from DescribeSpotPriceHistory (``adapters/ec2_market.py``). The fraction here
  is only the fallback when that call is unavailable (the static market, tests, the simulator).
- Throughput is relative to one p4d.24xlarge (8x A100 40GB, 400 Gbps EFA) for BF16 LLM
  pretraining at multi-node scale: p5 (8x H100, 3200 Gbps EFA) ~2.8x, from public MLPerf Training
  results and vendor guidance. It is workload-dependent; override it in ``PlacementConfig``.
- EFA interfaces: one per network card. p5.48xlarge has 32 network cards (32 EFA interfaces,
  3200 Gbps); p4d/p4de.24xlarge have 4 (400 Gbps). See the EC2 "Elastic Fabric Adapter" user guide.
- Restore minutes: boot, EFA/NCCL bring-up and loading a checkpoint from the local tier or S3:
  what an interruption costs in wall time before training resumes. Our own estimate.
- Availability zones: zone names that offered the type when the table was written; accounts map
  names to physical zones differently, so the EC2 market adapter prefers the live answer.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from spotrelay.domain.models import Pool


class InstanceInfo(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    instance_type: str
    gpus: int
    gpu: str
    vcpus: int
    efa_interfaces: int  # one per network card
    throughput: float  # relative to one p4d.24xlarge for BF16 LLM training
    restore_minutes: float  # boot + NCCL/EFA bring-up + checkpoint load


INSTANCES: dict[str, InstanceInfo] = {
    i.instance_type: i
    for i in (
        InstanceInfo(instance_type="p5.48xlarge", gpus=8, gpu="H100 80GB", vcpus=192, efa_interfaces=32,
                     throughput=2.8, restore_minutes=15.0),
        InstanceInfo(instance_type="p5e.48xlarge", gpus=8, gpu="H200 141GB", vcpus=192, efa_interfaces=32,
                     throughput=3.1, restore_minutes=15.0),
        InstanceInfo(instance_type="p4de.24xlarge", gpus=8, gpu="A100 80GB", vcpus=96, efa_interfaces=4,
                     throughput=1.1, restore_minutes=12.0),
        InstanceInfo(instance_type="p4d.24xlarge", gpus=8, gpu="A100 40GB", vcpus=96, efa_interfaces=4,
                     throughput=1.0, restore_minutes=12.0),
    )
}

# (region, instance type) -> on-demand USD per instance-hour (approximate, Linux).
ON_DEMAND_USD: dict[tuple[str, str], float] = {
    ("us-east-1", "p5.48xlarge"): 55.04,
    ("us-east-2", "p5.48xlarge"): 55.04,
    ("us-west-2", "p5.48xlarge"): 55.04,
    ("eu-west-1", "p5.48xlarge"): 60.54,
    ("us-east-1", "p5e.48xlarge"): 63.30,
    ("us-east-2", "p5e.48xlarge"): 63.30,
    ("us-east-1", "p4d.24xlarge"): 21.96,
    ("us-east-2", "p4d.24xlarge"): 21.96,
    ("us-west-2", "p4d.24xlarge"): 21.96,
    ("eu-west-1", "p4d.24xlarge"): 23.71,
    ("us-east-1", "p4de.24xlarge"): 27.45,
    ("us-west-2", "p4de.24xlarge"): 27.45,
}

# (region, instance type) -> Spot Advisor interruption band 0..4 (approximate; moves weekly).
ADVISOR_BAND: dict[tuple[str, str], int] = {
    ("us-east-1", "p5.48xlarge"): 2,
    ("us-east-2", "p5.48xlarge"): 2,
    ("us-west-2", "p5.48xlarge"): 3,
    ("eu-west-1", "p5.48xlarge"): 3,
    ("us-east-1", "p5e.48xlarge"): 3,
    ("us-east-2", "p5e.48xlarge"): 3,
    ("us-east-1", "p4d.24xlarge"): 1,
    ("us-east-2", "p4d.24xlarge"): 1,
    ("us-west-2", "p4d.24xlarge"): 2,
    ("eu-west-1", "p4d.24xlarge"): 2,
    ("us-east-1", "p4de.24xlarge"): 2,
    ("us-west-2", "p4de.24xlarge"): 2,
}

# Monthly interruption frequency we assume for each band: the band's midpoint (band 4: 25%).
BAND_MONTHLY_FREQUENCY: dict[int, float] = {0: 0.025, 1: 0.075, 2: 0.125, 3: 0.175, 4: 0.25}

# Fallback spot price as a fraction of on-demand, per instance type.
SPOT_FRACTION: dict[str, float] = {
    "p5.48xlarge": 0.40, "p5e.48xlarge": 0.42, "p4d.24xlarge": 0.40, "p4de.24xlarge": 0.41,
}

# Zones that offered the type (zone names; approximate).
AZS: dict[tuple[str, str], tuple[str, ...]] = {
    ("us-east-1", "p5.48xlarge"): ("us-east-1a", "us-east-1c", "us-east-1f"),
    ("us-east-2", "p5.48xlarge"): ("us-east-2a", "us-east-2b"),
    ("us-west-2", "p5.48xlarge"): ("us-west-2a", "us-west-2c"),
    ("eu-west-1", "p5.48xlarge"): ("eu-west-1a",),
    ("us-east-1", "p5e.48xlarge"): ("us-east-1a",),
    ("us-east-2", "p5e.48xlarge"): ("us-east-2b",),
    ("us-east-1", "p4d.24xlarge"): ("us-east-1a", "us-east-1b", "us-east-1c"),
    ("us-east-2", "p4d.24xlarge"): ("us-east-2a", "us-east-2b"),
    ("us-west-2", "p4d.24xlarge"): ("us-west-2a", "us-west-2b", "us-west-2c"),
    ("eu-west-1", "p4d.24xlarge"): ("eu-west-1a", "eu-west-1c"),
    ("us-east-1", "p4de.24xlarge"): ("us-east-1c",),
    ("us-west-2", "p4de.24xlarge"): ("us-west-2b",),
}

DEFAULT_REGIONS: tuple[str, ...] = ("us-east-1", "us-east-2", "us-west-2", "eu-west-1")


def instance(instance_type: str) -> InstanceInfo | None:
    return INSTANCES.get(instance_type)


def on_demand_price(region: str, instance_type: str) -> float | None:
    return ON_DEMAND_USD.get((region, instance_type))


def advisor_band(region: str, instance_type: str) -> int | None:
    return ADVISOR_BAND.get((region, instance_type))


def typical_spot_price(region: str, instance_type: str) -> float | None:
    od = on_demand_price(region, instance_type)
    fraction = SPOT_FRACTION.get(instance_type)
    return None if od is None or fraction is None else round(od * fraction, 4)


def instance_types() -> list[str]:
    """Every instance type the catalog has zones for, in any region, sorted."""
    return sorted({t for _, t in AZS})


def zones(region: str, instance_type: str) -> tuple[str, ...]:
    return AZS.get((region, instance_type), ())


def offered(region: str, instance_type: str) -> bool:
    return (region, instance_type) in ON_DEMAND_USD and bool(zones(region, instance_type))


def pools(regions: list[str], instance_types: list[str], markets: list[str]) -> list[Pool]:
    """Every pool the catalog offers for these regions, types and markets (each AZ of each)."""
    return [
        Pool(region=region, az=az, instance_type=itype, market=market)
        for region in regions
        for itype in instance_types
        if offered(region, itype)
        for az in zones(region, itype)
        for market in markets
    ]
