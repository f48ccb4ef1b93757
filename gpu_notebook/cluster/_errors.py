"""The cluster package's error (its own module: the cluster and its providers both raise it)."""

from __future__ import annotations

from gpu_notebook.errors import GpuNotebookError

__all__ = ["ClusterError", "not_running"]


class ClusterError(GpuNotebookError, RuntimeError):
    """A cluster operation could not be done (the message says why and what to do)."""


def not_running(name: str) -> ClusterError:
    """The error for work sent to a cluster that is not running (``name``: the cluster's, '' if it has none).

    >>> str(not_running("local"))
    "cluster 'local' is not running: start it with %gpu_cluster start"
    """
    return ClusterError(f"cluster {name or '?'!r} is not running: start it with %gpu_cluster start")
