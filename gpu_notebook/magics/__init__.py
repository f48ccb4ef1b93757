"""The IPython layer: thin magics over the library (``%gpu_cluster``, ``%%distributed``, ...).

``%load_ext gpu_notebook`` calls :func:`register`.
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


__all__ = ["MAGICS", "register"]
