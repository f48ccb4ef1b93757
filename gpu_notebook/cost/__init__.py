"""Cost of a cluster: a per-node, per-second cost meter, a budget cap and a GPU-aware idle stop.

>>> from gpu_notebook.cost import cost_meter_for, attach_policies
>>> meter = cost_meter_for(cluster)                                           # doctest: +SKIP
>>> meter.snapshot()                                                          # doctest: +SKIP
>>> attach_policies(cluster, idle_stop_minutes=60, budget_usd=25)            # doctest: +SKIP

Prices come from :mod:`gpu_notebook.catalog` and are list-price estimates; a local cluster costs $0.
Importing this package is cheap (no ray, boto3, plotly or ipywidgets).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = [
    "LOCAL_PRICE",
    "BudgetPolicy",
    "CostMeter",
    "CostSnapshot",
    "CpuUtilisation",
    "IdleStopPolicy",
    "MonitorUtilisation",
    "NodePrice",
    "PolicyWatcher",
    "attach_from_options",
    "attach_policies",
    "cost_meter_for",
    "describe",
    "default_utilisation",
    "resolve_price",
    "watcher_for",
]

if TYPE_CHECKING:  # pragma: no cover
    from gpu_notebook.cost._meter import (
        LOCAL_PRICE,
        CostMeter,
        CostSnapshot,
        NodePrice,
        cost_meter_for,
        resolve_price,
    )
    from gpu_notebook.cost._policies import (
        BudgetPolicy,
        CpuUtilisation,
        IdleStopPolicy,
        MonitorUtilisation,
        PolicyWatcher,
        attach_from_options,
        attach_policies,
        default_utilisation,
        describe,
        watcher_for,
    )

_LAZY = {
    "LOCAL_PRICE": "_meter",
    "CostMeter": "_meter",
    "CostSnapshot": "_meter",
    "NodePrice": "_meter",
    "cost_meter_for": "_meter",
    "resolve_price": "_meter",
    "BudgetPolicy": "_policies",
    "CpuUtilisation": "_policies",
    "IdleStopPolicy": "_policies",
    "MonitorUtilisation": "_policies",
    "PolicyWatcher": "_policies",
    "attach_from_options": "_policies",
    "attach_policies": "_policies",
    "describe": "_policies",
    "default_utilisation": "_policies",
    "watcher_for": "_policies",
}


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'gpu_notebook.cost' has no attribute {name!r}")
    return getattr(importlib.import_module(f"gpu_notebook.cost.{mod}"), name)


def __dir__() -> list[str]:
    return sorted(__all__)
