"""The uploader helper exits when the trainer closes it, even while a forked process holds its pipe.

A DataLoader worker forked after the helper started inherits the write end of the helper's stdin,
so closing stdin never reached EOF: ``session.close()`` waited 30 s per helper and then killed it
(a hand-written 2-rank FSDP2 script with ``num_workers=2`` "hung" in close). The helper is now told
to exit; it must end by itself, exit code 0, not by the kill.
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader

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
