"""A short chaos campaign in the twin (``spotrelay local chaos``, docs/chaos.md): two jobs under
seeded faults of several kinds. Whatever the machine's speed, the promises hold: nothing stuck, no
committed checkpoint lost, no cluster launched twice, nothing left running, and every succeeded
job's model is bit-identical to the uninterrupted reference. The long campaign is `make bench`."""

from __future__ import annotations

from pathlib import Path

import pytest

from spotrelay.local.campaign import CampaignOptions, run_campaign
from tests.e2e.waits import HANG_S

pytestmark = pytest.mark.slow

FAULTS = ("spot-notice", "kill", "ec2-duplicate", "s3-errors", "handler-crash", "capacity")


def test_short_campaign_keeps_every_promise(tmp_path: Path) -> None:
    lines: list[str] = []
    result = run_campaign(
        # "stuck" is a job not ended within the bound that catches a hang, like every e2e wait
        CampaignOptions(jobs=2, seed=5, faults=FAULTS, max_faults=4, parallel=2, steps=30, out=tmp_path,
                        job_timeout_s=HANG_S),
        on_line=lines.append,
    )
    summary = {k: result[k] for k in ("jobs", "succeeded", "failed", "stuck", "faults", "checkpoints_lost",
                                      "duplicate_clusters", "instances_left", "bit_identical")}
    assert result["faults"] >= 1, lines  # the campaign did inject
    # one job waits for spot by default (72 s at the twin's scale), the other states 0: neither may hang
    assert [r["spot_wait"] for r in result["records"]] == ["default", "0"]
    assert result["stuck"] == 0 and result["checkpoints_lost"] == 0, (summary, result["records"])
    assert result["duplicate_clusters"] == 0 and result["instances_left"] == 0, summary
    assert result["bit_identical"] == result["succeeded"], result["records"]
    assert result["failed_without_reason"] == 0, result["records"]  # a failed job names its reason


def test_unknown_fault_kind_is_named() -> None:
    with pytest.raises(ValueError, match=r"unknown fault kind.*explode"):
        CampaignOptions(faults=("kill", "explode"))
