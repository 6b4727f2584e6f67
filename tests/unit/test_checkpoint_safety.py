"""Loading a checkpoint never runs code from it."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch

from agent.checkpoint.safety import check_file, check_pickle, safe_torch_load
from spotrelay.errors import UnsafeCheckpointError
from tests.conftest import MaliciousPayload


def test_malicious_torch_file_is_refused_and_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    path = tmp_path / "model.pt"
    torch.save({"weights": torch.ones(2), "evil": MaliciousPayload(marker)}, path)
    with pytest.raises(UnsafeCheckpointError, match="refused"):
        safe_torch_load(path)
    assert not marker.exists()


def test_plain_weights_load(tmp_path: Path) -> None:
    path = tmp_path / "ok.pt"
    torch.save({"w": torch.arange(4), "step": 3, "names": ["a", "b"]}, path)
    loaded = safe_torch_load(path)
    assert loaded["step"] == 3 and torch.equal(loaded["w"], torch.arange(4))


def test_raw_pickle_with_os_system_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    data = pickle.dumps(MaliciousPayload(marker))
    with pytest.raises(UnsafeCheckpointError, match=r"posix\.system|os\.system"):
        check_pickle(data, "meta")
    path = tmp_path / ".metadata"
    path.write_bytes(data)
    with pytest.raises(UnsafeCheckpointError):
        check_file(path)
    assert not marker.exists()


def test_protocol_0_global_is_refused() -> None:
    data = b"cbuiltins\neval\n(S'1+1'\ntR."
    with pytest.raises(UnsafeCheckpointError, match=r"builtins\.eval"):
        check_pickle(data, "meta")


def test_real_dcp_metadata_passes(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    dcp.save({"w": torch.ones(3), "step": 1}, storage_writer=dcp.FileSystemWriter(str(tmp_path)), no_dist=True)
    check_file(tmp_path / ".metadata")  # nothing raised: DCP's own classes are on the allow-list
