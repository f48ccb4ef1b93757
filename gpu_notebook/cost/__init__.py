"""Cost of a cluster: a per-node, per-second cost meter, a budget cap and a GPU-aware idle stop.

>>> from gpu_notebook.cost import cost_meter_for, attach_policies
>>> meter = cost_meter_for(cluster)                                           # doctest: +SKIP
>>> meter.snapshot()                                                          # doctest: +SKIP
>>> attach_policies(cluster, idle_stop_minutes=60, budget_usd=25)            # doctest: +SKIP

Prices come from :mod:`gpu_notebook.catalog` and are list-price estimates; a local cluster costs $0.
Importing this package is cheap (no ray, boto3, plotly or ipywidgets).

The modules: ``_meter`` (the meter and its snapshots), ``_policy`` (what a policy is), ``_budget`` and ``_idle``
(the two policies), ``_watcher`` (the thread that checks them, and attaching them to a cluster). A cluster is
given to them as an argument; the shared meter and watcher of each cluster live in :mod:`gpu_notebook._registry`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpu_notebook._lazy import lazy_module

__all__ = [
    "LOCAL_PRICE",
    "BudgetPolicy",
    "CostMeter",
    "CostSnapshot",
    "CpuUtilisation",
    "IdleStopPolicy",
    "MonitorUtilisation",
    "NodePrice",
    "Policy",
    "PolicyWatcher",
    "add_policies",
    "attach_from_options",
    "attach_policies",
    "cost_meter_for",
    "describe",
    "default_utilisation",
    "resolve_price",
    "watcher_for",
]

if TYPE_CHECKING:  # pragma: no cover
    from gpu_notebook.cost._budget import BudgetPolicy
    from gpu_notebook.cost._idle import (
        CpuUtilisation,
        IdleStopPolicy,
        MonitorUtilisation,
        default_utilisation,
    )
    from gpu_notebook.cost._meter import (
        LOCAL_PRICE,
        CostMeter,
        CostSnapshot,
        NodePrice,
        cost_meter_for,
        resolve_price,
    )
    from gpu_notebook.cost._policy import Policy
    from gpu_notebook.cost._watcher import (
        PolicyWatcher,
        add_policies,
        attach_from_options,
        attach_policies,
        describe,
        watcher_for,
    )

__getattr__, __dir__ = lazy_module(
    __name__,
    __all__,
    {
        "LOCAL_PRICE": "._meter",
        "CostMeter": "._meter",
        "CostSnapshot": "._meter",
        "NodePrice": "._meter",
        "cost_meter_for": "._meter",
        "resolve_price": "._meter",
        "Policy": "._policy",
        "BudgetPolicy": "._budget",
        "CpuUtilisation": "._idle",
        "IdleStopPolicy": "._idle",
        "MonitorUtilisation": "._idle",
        "default_utilisation": "._idle",
        "PolicyWatcher": "._watcher",
        "add_policies": "._watcher",
        "attach_from_options": "._watcher",
        "attach_policies": "._watcher",
        "describe": "._watcher",
        "watcher_for": "._watcher",
    },
)
