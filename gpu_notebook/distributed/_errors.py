"""The worker group's error, in a module of its own: the group and its placements both raise it."""

from __future__ import annotations

from gpu_notebook.errors import GpuNotebookError

__all__ = ["GroupError"]


class GroupError(GpuNotebookError, RuntimeError):
    """The worker group could not be started or rebuilt (the message says why and what to do)."""
