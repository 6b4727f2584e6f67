"""The uploader helper exits when the trainer closes it, even while a forked process holds its pipe.

A DataLoader worker forked after the helper started inherits the write end of the helper's stdin,
so closing stdin never reached EOF: ``session.close()`` waited 30 s per helper and then killed it
(a hand-written 2-rank FSDP2 script with ``num_workers=2`` "hung" in close). The helper is now told
to exit; it must end by itself, exit code 0, not by the kill.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

from agent.checkpoint.uploader import UploaderProcess


def test_helper_exits_on_close_while_a_dataloader_worker_holds_its_stdin() -> None:
    uploader = UploaderProcess(None, emergency=True)
    proc = uploader.start()
    loader = DataLoader(torch.arange(64), batch_size=4, num_workers=1, persistent_workers=True)
    batches = iter(loader)
    assert next(batches).tolist() == [0, 1, 2, 3]  # the worker is forked and alive
    try:
        uploader.close(timeout=60)
        assert proc.returncode == 0, f"the helper was killed (returncode {proc.returncode}), it never saw the exit"
    finally:
        del batches
        if proc.poll() is None:
            proc.kill()


def test_close_of_a_helper_that_already_exited_is_quiet() -> None:
    uploader = UploaderProcess(None)
    proc = uploader.start()
    proc.kill()
    proc.wait()
    uploader.close()  # no BrokenPipeError
    uploader.close()  # twice is fine too


def test_a_session_with_dataloader_workers_closes_its_helpers_cleanly(tmp_path: Path) -> None:
    """The user's path: a session saving while its DataLoader's workers are alive (forked after the
    emergency helper started, which every session starts at once)."""
    from agent.training import spotrelay_session

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.randn(32, 4))
    loader = DataLoader(data, batch_size=4, num_workers=1, persistent_workers=True)
    session = spotrelay_session(model, optimizer, dataloader=loader, checkpoint_dir=tmp_path, every_steps=2)
    for _step, (x,) in session.steps(4):
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()
        session.step_done(0.5, samples=len(x))
    session.pipeline.flush()  # both saves written: the periodic helper has started too
    helpers = [u._proc for u in session.pipeline.uploaders.values() if u._proc is not None]
    assert len(helpers) == 2 and session.close() == 0
    assert [p.returncode for p in helpers] == [0] * len(helpers), "a helper was killed: it never saw the exit"
