"""Loading never runs code from a checkpoint.

torch files are loaded with ``weights_only=True`` (its unpickler builds only tensors, containers
and the few classes allow-listed here). Files torch would load with plain ``pickle`` (DCP's
``.metadata``) are scanned first: every global a pickle names must be on an allow-list, so a
crafted ``__reduce__`` (``os.system``, ``builtins.eval``...) is refused before anything runs.
"""

from __future__ import annotations

import importlib
import io
import pickle
import pickletools
import sys
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from spotrelay.errors import UnsafeCheckpointError

# Module prefixes whose classes a DCP ``.metadata`` pickle legitimately names (plain data classes).
_METADATA_MODULES = (
    "torch.distributed.checkpoint.metadata",
    "torch.distributed.checkpoint.planner",
    "torch.distributed.checkpoint.filesystem",
    "torch.distributed.checkpoint._extension",
)
_METADATA_GLOBALS = {
    ("torch", "Size"),
    ("torch", "float32"), ("torch", "float16"), ("torch", "bfloat16"), ("torch", "float64"),
    ("torch", "int64"), ("torch", "int32"), ("torch", "int8"), ("torch", "uint8"), ("torch", "bool"),
    ("torch", "strided"),
    ("collections", "OrderedDict"),
    ("builtins", "set"), ("builtins", "frozenset"), ("builtins", "slice"),
    ("pathlib", "PosixPath"),
    ("torch.serialization", "_get_layout"),
}  # fmt: skip


def _globals_in(data: bytes) -> Iterable[tuple[str, str]]:
    """Every (module, name) a pickle would import, including STACK_GLOBAL with memoised strings."""
    strings: list[str] = []
    memo: dict[int, Any] = {}
    last: Any = None
    for opcode, arg, _pos in pickletools.genops(io.BytesIO(data)):
        name = opcode.name
        if name in ("GLOBAL", "INST"):
            module, _, attr = str(arg).partition(" ")
            yield module, attr
        elif name == "STACK_GLOBAL":
            if len(strings) < 2:
                raise UnsafeCheckpointError("pickle builds a global from values it computed")
            yield strings[-2], strings[-1]
        if name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE", "BINUNICODE8", "SHORT_BINSTRING"):
            last = str(arg)
            strings.append(last)
        elif name in ("BINPUT", "LONG_BINPUT", "PUT"):
            memo[int(arg or 0)] = last
        elif name == "MEMOIZE":
            memo[len(memo)] = last
        elif name in ("BINGET", "LONG_BINGET", "GET"):
            last = memo.get(int(arg or 0))
            if isinstance(last, str):
                strings.append(last)
        else:
            last = None


def check_pickle(data: bytes, source: str, allowed: set[tuple[str, str]] | None = None) -> None:
    """Raise UnsafeCheckpointError when the pickle names a global off the allow-list."""
    allowed = _METADATA_GLOBALS if allowed is None else allowed
    try:
        found = list(_globals_in(data))
    except (ValueError, EOFError) as exc:
        raise UnsafeCheckpointError(f"{source}: not a readable pickle ({exc})") from exc
    for module, attr in found:
        if (module, attr) in allowed or module.startswith(_METADATA_MODULES):
            continue
        raise UnsafeCheckpointError(f"{source}: refused to load, the pickle imports {module}.{attr}")


def check_file(path: Path) -> None:
    """Scan a raw pickle file, or every pickle inside a torch zip file."""
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            for member in archive.namelist():
                if member.endswith(".pkl"):
                    check_pickle(archive.read(member), f"{path}:{member}")
        return
    check_pickle(path.read_bytes(), str(path))


def check_torch_bytes(data: bytes | bytearray, source: str) -> None:
    """Scan every pickle inside ``torch.save`` bytes (a zip) before anything unpickles them."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile as exc:
        raise UnsafeCheckpointError(f"{source}: not a torch.save archive ({exc})") from exc
    with archive:
        for member in archive.namelist():
            if member.endswith(".pkl"):
                check_pickle(archive.read(member), f"{source}:{member}")


def _deepspeed_globals() -> list[Any]:
    """Plain-data classes DeepSpeed puts in its checkpoints (ZeRO stage enum, loss scalers)."""
    found: list[Any] = []
    if "deepspeed" not in sys.modules:  # a DeepSpeed checkpoint is only loaded by a DeepSpeed run
        return found
    try:
        from deepspeed.runtime.fp16 import loss_scaler
        from deepspeed.runtime.zero import config as zero_config

        # deepspeed.utils re-exports a class named tensor_fragment that hides the module
        tensor_fragment = importlib.import_module("deepspeed.utils.tensor_fragment")
        found += [loss_scaler.LossScaler, loss_scaler.DynamicLossScaler, zero_config.ZeroStageEnum]
        found.append(tensor_fragment.fragment_address)
    except ImportError:  # the DDP path does not need DeepSpeed installed
        pass
    return found


def safe_torch_load(path: Path | str, map_location: Any = None) -> Any:
    """``torch.load(weights_only=True)``; a refusal becomes UnsafeCheckpointError."""
    import torch

    try:
        with torch.serialization.safe_globals(_deepspeed_globals()):
            return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UnsafeCheckpointError(f"{path}: refused to load ({first})") from exc
