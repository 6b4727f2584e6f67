"""Optional packages that libraries probe for at import time, imported on first use in the ranks.

DeepSpeed's ``import deepspeed`` runs ``try: import mlflow`` (its autotuner can log there), and
mlflow is installed on every node (the agent tracks runs with it). A rank that never touches mlflow
still paid its whole import, pandas included: 2-5 s of every trainer start on a loaded 2-core
machine, the largest part of ``import deepspeed`` and of the restart after a recovery (bench/restart.py).

The per-rank wrapper (agent.launcher.worker_main) registers such a package as a ``DeferredModule``
before the user's script runs: ``import mlflow`` succeeds at once, and the real import runs when
anything reads an attribute of the module (or imports a submodule), so code that uses mlflow gets
the real package, only later. Importing a submodule reads the package's ``__path__``, which loads
the package first, as a plain import would. What scanners of ``sys.modules`` read without using the
package (``inspect.getmodule`` reads every module's ``__file__``) is answered from its spec.
``SPOTRELAY_DEFER_IMPORTS=0`` in the job's environment turns it off.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
import types
from importlib.machinery import ModuleSpec
from typing import Any

ENV_DEFER = "SPOTRELAY_DEFER_IMPORTS"  # "0": import everything eagerly (bench/restart.py compares)
DEFERRED = ("mlflow",)  # probed by `import deepspeed`; used by the agent, not by the ranks
_LOCK = threading.RLock()
# answered without loading (not __path__: a submodule import reads it, and must run the package first)
_OWN = frozenset({"__name__", "__spec__", "__file__", "__loader__", "__package__", "__doc__"})


class DeferredModule(types.ModuleType):
    """Stands in ``sys.modules`` for a package until something uses it, then forwards to it."""

    def __init__(self, spec: ModuleSpec) -> None:
        super().__init__(spec.name)
        self.__spec__ = spec
        self.__loader__ = spec.loader
        self.__file__ = spec.origin
        self.__package__ = spec.parent if spec.submodule_search_locations is None else spec.name

    def _real(self) -> types.ModuleType:
        with _LOCK:
            real = self.__dict__.get("_deferred_real")
            if real is None:
                if sys.modules.get(self.__name__) is self:
                    del sys.modules[self.__name__]
                try:
                    real = importlib.import_module(self.__name__)
                except BaseException:
                    sys.modules.setdefault(self.__name__, self)  # as before: the next use tries again
                    raise
                self.__dict__["_deferred_real"] = real
            return real

    def __getattr__(self, name: str) -> Any:  # only for what this stand-in does not hold itself
        if name == "_deferred_real":
            raise AttributeError(name)
        return getattr(self._real(), name)

    def __setattr__(self, name: str, value: Any) -> None:
        # the import system sets a submodule on its parent (this stand-in) after loading it
        super().__setattr__(name, value)
        if name not in _OWN:
            setattr(self._real(), name, value)

    def __dir__(self) -> list[str]:
        return dir(self._real())

    @property
    def loaded(self) -> bool:
        return "_deferred_real" in self.__dict__


def defer(names: tuple[str, ...] = DEFERRED) -> list[str]:
    """Register each installed, not yet imported top-level package as deferred; the names registered."""
    done: list[str] = []
    for name in names:
        if name in sys.modules or "." in name:
            continue
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        if spec is None or spec.loader is None:
            continue  # not installed: `import name` fails as it always did
        sys.modules[name] = DeferredModule(spec)
        done.append(name)
    return done
