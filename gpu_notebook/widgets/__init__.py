"""Notebook views of gpu_notebook objects: ipywidgets + plotly ``FigureWidget`` dashboards.

Importing this package is cheap: ipywidgets and plotly load when a widget class is first used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["CostWidget", "MonitorWidget", "cost_view"]

if TYPE_CHECKING:  # pragma: no cover
    from gpu_notebook.widgets._cost import CostWidget, cost_view
    from gpu_notebook.widgets._monitor import MonitorWidget

_LAZY = {
    "CostWidget": "gpu_notebook.widgets._cost",
    "cost_view": "gpu_notebook.widgets._cost",
    "MonitorWidget": "gpu_notebook.widgets._monitor",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'gpu_notebook.widgets' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(__all__)
