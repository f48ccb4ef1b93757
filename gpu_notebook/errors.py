"""The root of every error gpu_notebook raises on purpose.

Each package keeps its own exception classes (``ClusterError``, ``CheckpointError``, ``DistributedError``...),
and every one of them also derives from :class:`GpuNotebookError`. The magics catch this one class to show a
one-line message without our internals' traceback; anything else is a bug and keeps its traceback. Library
users can catch it the same way (``except GpuNotebookError``), as ``requests`` users catch
``RequestException``.
"""

from __future__ import annotations

__all__ = ["GpuNotebookError"]


class GpuNotebookError(Exception):
    """Base class of every error of gpu_notebook's own (not the ones of Ray, torch or boto3 it passes on)."""
