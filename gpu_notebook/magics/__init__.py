"""The IPython layer: thin magics over the library (``%gpu_cluster``, ``%%distributed``, ...).

``%load_ext gpu_notebook`` calls :func:`register`; ``%unload_ext gpu_notebook`` calls :func:`unregister`.
Every magic always exists once the extension is loaded: a magics module that cannot be imported (a package it
needs is missing) is replaced by a stand-in whose magics fail the cell saying what failed and which extra to
install, so a notebook never meets ``UsageError: Line magic function `%gpu_monitor` not found``.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from IPython.core.magic import Magics, magics_class

from gpu_notebook.magics._common import MissingExtra, shown_short

if TYPE_CHECKING:  # pragma: no cover
    from IPython.core.interactiveshell import InteractiveShell


@dataclass(frozen=True)
class MagicsPart:
    """One magics class, and what a stand-in needs to know without importing its module."""

    module: str  # where the class lives
    cls: str  # its name (also its key in IPython's registry of magics)
    extra: str  # the gpu_notebook extra that installs what its magics need
    line: tuple[str, ...] = ()  # its line magics
    cell: tuple[str, ...] = ()  # its cell magics

    @property
    def names(self) -> list[str]:
        """``%name`` for each line magic, ``%%name`` for each cell magic."""
        return [f"%{n}" for n in self.line] + [f"%%{n}" for n in self.cell]


MAGICS = (
    MagicsPart("gpu_notebook.magics._cluster", "ClusterMagics", "ray", line=("gpu_cluster",)),
    MagicsPart(
        "gpu_notebook.magics._distributed",
        "DistributedMagics",
        "ray",
        line=("gpu_push", "gpu_pull", "gpu_result"),
        cell=("distributed",),
    ),
    MagicsPart("gpu_notebook.magics._run", "RunMagics", "ray", line=("gpu_run",)),
    MagicsPart("gpu_notebook.magics._debug", "DebugMagics", "ray", line=("gpu_debug",)),
    MagicsPart("gpu_notebook.magics._checkpoint", "CheckpointMagics", "checkpoint", line=("gpu_checkpoint",)),
    MagicsPart("gpu_notebook.magics._monitor", "MonitorMagics", "monitor", line=("gpu_monitor",)),
    MagicsPart("gpu_notebook.magics._cost", "CostMagics", "widgets", line=("gpu_cost",)),
)


class UnavailableMagics(Magics):
    """Stands in for a magics class whose module could not be imported: each magic says why, and what to
    install, instead of not existing."""

    part: MagicsPart
    reason: str

    def __init__(self, shell: Any = None, **kwargs: Any) -> None:
        super().__init__(shell, **kwargs)
        for name in self.part.line:
            self.magics["line"][name] = self._say
        for name in self.part.cell:
            self.magics["cell"][name] = self._say

    def _say(self, line: str = "", cell: str | None = None) -> None:
        raise shown_short(
            MissingExtra(
                f"{' and '.join(self.part.names)} could not be loaded ({self.reason}): "
                f"pip install 'gpu_notebook[{self.part.extra}]', then restart the kernel"
            )
        )


def _stand_in(part: MagicsPart, exc: ImportError) -> type[Magics]:
    """A :class:`UnavailableMagics` class named as ``part``'s (so :func:`unregister` finds it)."""
    cls = type(part.cls, (UnavailableMagics,), {"part": part, "reason": str(exc)})
    return magics_class(cls)


def register(ipython: InteractiveShell) -> None:
    """Register every gpu_notebook magics class with ``ipython`` (a stand-in where its module fails to import)."""
    for part in MAGICS:
        try:
            cls = getattr(importlib.import_module(part.module), part.cls)
        except ImportError as exc:
            cls = _stand_in(part, exc)
        ipython.register_magics(cls)


def _ours(part: MagicsPart, instance: Any) -> bool:
    if isinstance(instance, UnavailableMagics):
        return instance.part == part
    mod = sys.modules.get(part.module)
    cls = getattr(mod, part.cls, None) if mod is not None else None
    return cls is not None and isinstance(instance, cls)


def _stop_views(instance: Any) -> None:
    """Stop the live views (``%gpu_cost``, ``%gpu_monitor``) this magics instance started: once it is unloaded,
    no magic can reach them to stop them, and their refresh threads would run on."""
    views = getattr(instance, "_widgets", None)
    if not isinstance(views, list):
        return
    for view in views:
        stop = getattr(view, "stop", None)
        if callable(stop):
            stop()
    views.clear()


def unregister(ipython: InteractiveShell) -> list[str]:
    """Remove the gpu_notebook magics from ``ipython`` (``%unload_ext``, ``%reload_ext``); returns the names
    removed. The live views they started stop (each leaves its static snapshot); the objects they showed (a
    monitor, a cluster's cost meter) keep running.

    Only what :func:`register` put there goes: a magic of the same name someone registered since stays.
    """
    manager = ipython.magics_manager
    removed: list[str] = []
    for part in MAGICS:
        instance = manager.registry.get(part.cls)
        if instance is None or not _ours(part, instance):
            continue
        _stop_views(instance)
        del manager.registry[part.cls]
        for kind, table in manager.magics.items():
            for magic_name, func in instance.magics.get(kind, {}).items():
                if table.get(magic_name) == func:
                    del table[magic_name]
                    removed.append(("%%" if kind == "cell" else "%") + magic_name)
    return removed


__all__ = ["MAGICS", "MagicsPart", "UnavailableMagics", "register", "unregister"]
