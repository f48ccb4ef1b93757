"""A local Ray started on this machine (the embedded default): nothing to launch, nothing to tear down.

``Cluster.start`` starts Ray itself (``ray.init`` without an address, see :mod:`gpu_notebook.cluster._connect`)
and shuts it down at stop when no other cluster uses it.
"""

from __future__ import annotations

from .base import Provider

__all__ = ["LocalProvider"]


class LocalProvider(Provider):
    """This machine: clusters are named ``local``, ``local-2``, ..."""

    kind = "local"
