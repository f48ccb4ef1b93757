"""The kernel's cluster manager, typed for :class:`Cluster`.

The manager itself lives in :mod:`gpu_notebook._registry` (the bottom layer), so that the cost meter and the
monitor can ask for the current cluster without importing this package.
"""

from __future__ import annotations

from gpu_notebook import _registry
from gpu_notebook._registry import ClusterManager
from gpu_notebook.cluster._cluster import Cluster

__all__ = ["ClusterManager", "get_manager"]


def get_manager() -> ClusterManager[Cluster]:
    """The kernel's cluster manager (created on first use; stops our clusters at exit)."""
    return _registry.get_manager()
