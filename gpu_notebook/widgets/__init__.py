"""Notebook views of gpu_notebook objects: ipywidgets + plotly ``FigureWidget`` dashboards.

Both views are :class:`~gpu_notebook.widgets._live.LiveView` s: a refresh thread, ``start``/``stop``/``close``,
and a static ``text/html`` fallback. Importing this package is cheap: ipywidgets and plotly load when a widget
class is first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpu_notebook._lazy import lazy_module

__all__ = [
    "CostWidget",
    "MonitorWidget",
    "Static",
    "StudentsWidget",
    "cost_view",
    "live_views",
    "stop_live_views",
    "students_view",
]

if TYPE_CHECKING:  # pragma: no cover
    from gpu_notebook.widgets._cost import CostWidget, cost_view
    from gpu_notebook.widgets._live import Static, live_views, stop_live_views
    from gpu_notebook.widgets._monitor import MonitorWidget
    from gpu_notebook.widgets._students import StudentsWidget, students_view

__getattr__, __dir__ = lazy_module(
    __name__,
    __all__,
    {
        "CostWidget": "._cost",
        "cost_view": "._cost",
        "MonitorWidget": "._monitor",
        "Static": "._live",
        "live_views": "._live",
        "stop_live_views": "._live",
        "StudentsWidget": "._students",
        "students_view": "._students",
    },
)
