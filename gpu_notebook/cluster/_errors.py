"""The cluster package's error (its own module: the cluster and its providers both raise it)."""

from __future__ import annotations

from gpu_notebook.errors import GpuNotebookError

__all__ = ["ClusterError"]


class ClusterError(GpuNotebookError, RuntimeError):
    """A cluster operation could not be done (the message says why and what to do)."""
