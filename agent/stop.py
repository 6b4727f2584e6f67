"""Coordinated stop: every rank acts on a stop request at the same step boundary.

Each rank polls the agent's ``request.json`` (one ``stat`` per step; the file is read only when
it changed), then all ranks agree with one all-reduce(MAX) of four integers: the request code
(strongest request wins), whether a time-based checkpoint is due (rank clocks differ), the
earliest deadline, and whether any rank must start its final save of a notice window now
(agent/notice_window.py: each rank judges by its own flush time, the earliest one wins). A request
id already acted on (also across a restart) is ignored.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from spotrelay.contracts.control import REQUEST_CODE, RequestKind, StopRequest, read_request

_NO_DEADLINE = -(2**62)
CODE_KIND = {code: kind for kind, code in REQUEST_CODE.items()}


class RequestPoller:
    def __init__(self, control_dir: Path | None, handled: set[str] | None = None) -> None:
        self.control_dir = control_dir
        self.handled = handled if handled is not None else set()
        self._seen: tuple[int, int] | None = None
        self._request: StopRequest | None = None

    def poll(self) -> StopRequest | None:
        if self.control_dir is None:
            return None
        try:
            st = os.stat(self.control_dir / "request.json")
        except FileNotFoundError:
            self._seen, self._request = None, None
            return None
        key = (st.st_mtime_ns, st.st_size)
        if key != self._seen:
            self._seen, self._request = key, read_request(self.control_dir)
        if self._request is None or self._request.request_id in self.handled:
            return None
        return self._request


@dataclass(frozen=True)
class Decision:
    kind: RequestKind | None
    checkpoint_due: bool
    deadline: float | None
    extra: tuple[int, ...] = ()
    final_due: bool = False


def agree(
    local: StopRequest | None, due: bool, device: str = "cpu", extra: list[int] | None = None, final_due: bool = False
) -> Decision:
    """One all-reduce(MAX) over the world; without torch.distributed, the local view decides.
    ``extra``: more integers that ride in the same all-reduce (the health checks' flags)."""
    code = REQUEST_CODE[local.kind] if local is not None else 0
    deadline_ms = int(local.deadline * 1000) if local is not None and local.deadline else None
    values = [code, int(due), -deadline_ms if deadline_ms is not None else _NO_DEADLINE, int(final_due)]
    values += list(extra or ())
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        import torch

        tensor = torch.tensor(values, dtype=torch.int64, device=device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        values = [int(v) for v in tensor.tolist()]
    deadline = -values[2] / 1000 if values[2] != _NO_DEADLINE else None
    return Decision(kind=CODE_KIND[values[0]], checkpoint_due=bool(values[1]), deadline=deadline,
                    final_due=bool(values[3]), extra=tuple(values[4:]))  # fmt: skip


def gather_ids(request_id: str | None) -> list[str]:
    """Every rank's request id (rare: only after a request was agreed), so all mark it handled."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return [request_id] if request_id else []
    ids: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(ids, request_id)
    return sorted({i for i in ids if i})


def all_ok(ok: bool, device: str = "cpu") -> bool:
    """True only when every rank's flag is True (a save counts only if every rank finished)."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return ok
    flag = torch.tensor([0 if ok else 1], dtype=torch.int64, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return int(flag.item()) == 0


def any_rank(flag: bool, device: str = "cpu") -> bool:
    """True when any rank's flag is True."""
    return not all_ok(not flag, device)
