"""The IPython layer: thin magics over the library (``%gpu_cluster``, ``%%distributed``, ...).

``%load_ext gpu_notebook`` calls :func:`register`; ``%unload_ext gpu_notebook`` calls :func:`unregister`.
"""

from __future__ import annotations

import importlib
from typing import Any

# (module, class) of every magics class; a part whose optional dependencies are missing is skipped with a note.
MAGICS = [
    ("gpu_notebook.magics._cluster", "ClusterMagics"),
    ("gpu_notebook.magics._distributed", "DistributedMagics"),
    ("gpu_notebook.magics._checkpoint", "CheckpointMagics"),
    ("gpu_notebook.magics._monitor", "MonitorMagics"),
    ("gpu_notebook.magics._cost", "CostMagics"),
]


def register(ipython: Any) -> None:
    """Register every gpu_notebook magics class with ``ipython``."""
    for module, name in MAGICS:
        try:
            cls = getattr(importlib.import_module(module), name)
        except ImportError as exc:
            print(f"gpu_notebook: {module} not loaded ({exc}); install gpu_notebook[all] for it")
            continue
        ipython.register_magics(cls)


def unregister(ipython: Any) -> list[str]:
    """Remove the gpu_notebook magics from ``ipython`` (``%unload_ext``); returns the names removed.

    Only what :func:`register` put there goes: a magic of the same name someone registered since stays.
    """
    import sys

    manager = ipython.magics_manager
    removed: list[str] = []
    for module, name in MAGICS:
        mod = sys.modules.get(module)
        cls = getattr(mod, name, None) if mod is not None else None
        instance = manager.registry.get(name)
        if cls is None or not isinstance(instance, cls):
            continue
        del manager.registry[name]
        for kind, table in manager.magics.items():
            for magic_name, func in instance.magics.get(kind, {}).items():
                if table.get(magic_name) == func:
                    del table[magic_name]
                    removed.append(("%%" if kind == "cell" else "%") + magic_name)
    return removed


__all__ = ["MAGICS", "register", "unregister"]
