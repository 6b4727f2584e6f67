"""A ZeRO checkpoint resumed with bf16 turned on or off at the same size and stage goes through the
reshard (agent.checkpoint.deepspeed_engine.DeepSpeedEngine.load): DeepSpeed's own load looks only for its
own mode's optimizer files (its fallback to the other mode never runs) and failed with FileNotFoundError
(``.../zero_pp_rank_0_mp_rank_00_optim_states.pt``). Probed on real one-rank engines (7 December):
ZeRO-1 fp32 -> bf16, ZeRO-2 bf16 -> fp32, ZeRO-3 both ways."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from agent.checkpoint.deepspeed_engine import DeepSpeedEngine


@pytest.mark.parametrize(("prefix", "bf16", "other"), [("bf16_", False, True), ("", True, True),
                                                         ("bf16_", True, False), ("", False, False)])
def test_a_checkpoint_of_the_other_precision_is_resharded(tmp_path: Path, prefix: str, bf16: bool,
                                                          other: bool) -> None:
    (tmp_path / f"{prefix}zero_pp_rank_0_mp_rank_00_optim_states.pt").touch()
    engine = DeepSpeedEngine(SimpleNamespace(module=None, bfloat16_enabled=lambda: bf16))
    assert engine._other_precision(tmp_path, 2) is other
    assert engine._other_precision(tmp_path, 0) is False  # stage 0: DeepSpeed's load (see docs/checkpoints.md)
