"""The switches ``SpotrelayRun`` takes as they are, checked when a run is made (sim/runner.make_run).

Left interpreted by the native build (spotrelay/sim_native.py, ``INTERPRETED``): mypyc cannot compile a
pydantic model's class body.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class RunSwitches(BaseModel):
    """keep_margin's own check (RecoveryContext's bound) came only at the run's first recovery, as a bare
    ValidationError naming no switch, and rebalance_checkpoint took any word as true, "off" too."""

    model_config = ConfigDict(extra="forbid")
    rebalance_checkpoint: bool = True
    keep_margin: float | None = Field(None, ge=0, allow_inf_nan=False)
