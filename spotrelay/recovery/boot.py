"""How long a new instance takes from launch to its agent's NodeReady: the deadline of a move's save.

A voluntary move (``services/migrate.py``) launches the new gang first, then tells the old ranks to
save by the time the new gang is expected ready, so they train through the boot and take their final
save as late as their flush allows. Too early a deadline idles the old gang; too late one makes the
new gang wait for the drain (agent ``wait_for_drain``). The compute adapter answers
``Compute.expected_boot_s``: the twin's market model knows its modeled (scaled) boot; on EC2 it is
this table, by instance type.

Our own estimates for the GPU AMIs (launch -> running -> user data -> agent up and registered), not
measured here: a p5 attaches 32 EFA interfaces and loads a larger driver stack than a p4d (4).
Unknown types get ``DEFAULT_BOOT_S``. The placement review splits a move's cost with the same
estimate (``better_placement``'s ``boot_s``).
"""

from __future__ import annotations

DEFAULT_BOOT_S = 300.0
BOOT_S: dict[str, float] = {
    "p5.48xlarge": 420.0,
    "p5e.48xlarge": 420.0,
    "p5en.48xlarge": 420.0,
    "p4d.24xlarge": 300.0,
    "p4de.24xlarge": 300.0,
}


def ec2_boot_seconds(instance_type: str) -> float:
    """Expected seconds from an EC2 launch of ``instance_type`` to NodeReady."""
    return BOOT_S.get(instance_type, DEFAULT_BOOT_S)
