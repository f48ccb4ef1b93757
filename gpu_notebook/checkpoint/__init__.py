"""Lossless delta checkpoints of training state to a local folder or S3.

>>> from gpu_notebook import checkpoint
>>> ckpt = checkpoint.Checkpointer("s3://my-bucket/runs/exp1")        # doctest: +SKIP
>>> ckpt = checkpoint.Checkpointer("s3://my-bucket/runs/exp1", policy=checkpoint.PolicyOptions(every_minutes=15))  # doctest: +SKIP
>>> ckpt.save({"model": model, "optim": optimizer, "step": step})     # doctest: +SKIP
>>> state = ckpt.restore(into={"model": model, "optim": optimizer})   # doctest: +SKIP

Importing this package is cheap: torch, numpy-heavy codecs, zstandard and boto3 load on first use.
The format is described in ``docs/checkpoint-format.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = [
    "Checkpointer",
    "SaveOptions",
    "PolicyOptions",
    "DistributedOptions",
    "StorageOptions",
    "RuntimeOptions",
    "SaveHandle",
    "CheckpointInfo",
    "CheckpointList",
    "GcResult",
    "DiffResult",
    "ShowResult",
    "Store",
    "LocalStore",
    "S3Store",
    "ObjectInfo",
    "open_store",
    "current",
    "rng_state",
    "set_rng_state",
    "PerRank",
    "CheckpointError",
    "StoreError",
    "ObjectMissingError",
    "IntegrityError",
    "FormatVersionError",
    "ShapeMismatchError",
    "NoCheckpointError",
    "CheckpointSaveError",
    "UnsafeValueError",
    "FORMAT_VERSION",
    "PreemptionWatcher",
    "PreemptionNotice",
    "detect_cloud",
    "export",
    "ExportResult",
    "ExportError",
]

from .._lazy import lazy_module
from ._errors import (
    CheckpointError,
    CheckpointSaveError,
    FormatVersionError,
    IntegrityError,
    NoCheckpointError,
    ObjectMissingError,
    ShapeMismatchError,
    StoreError,
    UnsafeValueError,
)
from .format.manifest import CheckpointInfo, CheckpointList
from .stores import LocalStore, ObjectInfo, S3Store, Store, open_store

if TYPE_CHECKING:  # pragma: no cover
    from ._export import ExportError, ExportResult
    from ._open import export
    from ._preemption import PreemptionNotice, PreemptionWatcher, detect_cloud
    from ._rng import rng_state, set_rng_state
    from .checkpointer import Checkpointer, current
    from .options import (
        DistributedOptions,
        PolicyOptions,
        RuntimeOptions,
        SaveOptions,
        StorageOptions,
    )
    from .per_rank import PerRank
    from .reader import FORMAT_VERSION
    from .results import DiffResult, GcResult, ShowResult
    from .save.handle import SaveHandle

__getattr__, __dir__ = lazy_module(
    __name__,
    __all__,
    {
        "Checkpointer": ".checkpointer",
        "SaveOptions": ".options",
        "PolicyOptions": ".options",
        "DistributedOptions": ".options",
        "StorageOptions": ".options",
        "RuntimeOptions": ".options",
        "SaveHandle": ".save.handle",
        "current": ".checkpointer",
        "GcResult": ".results",
        "DiffResult": ".results",
        "ShowResult": ".results",
        "rng_state": "._rng",
        "set_rng_state": "._rng",
        "PerRank": ".per_rank",
        "FORMAT_VERSION": ".reader",  # (the reader imports numpy)
        "PreemptionWatcher": "._preemption",
        "PreemptionNotice": "._preemption",
        "detect_cloud": "._preemption",
        "export": "._open",
        "ExportResult": "._export",
        "ExportError": "._export",
    },
)
