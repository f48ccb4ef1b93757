"""Lossless delta checkpoints of training state to a local folder or S3.

>>> from gpu_notebook import checkpoint
>>> ckpt = checkpoint.Checkpointer("s3://my-bucket/runs/exp1")        # doctest: +SKIP
>>> ckpt.save({"model": model, "optim": optimizer, "step": step})     # doctest: +SKIP
>>> state = ckpt.restore(into={"model": model, "optim": optimizer})   # doctest: +SKIP

Importing this package is cheap: torch, numpy-heavy codecs, zstandard and boto3 load on first use.
The format is described in ``docs/checkpoint-format.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = [
    "Checkpointer",
    "SaveHandle",
    "CheckpointInfo",
    "CheckpointList",
    "GcResult",
    "DiffResult",
    "Store",
    "LocalStore",
    "S3Store",
    "ObjectInfo",
    "open_store",
    "current",
    "rng_state",
    "set_rng_state",
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
    "FakeMetadataServer",
    "detect_cloud",
]

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
from ._manifest import FORMAT_VERSION, CheckpointInfo, CheckpointList
from ._store import LocalStore, ObjectInfo, Store, open_store

if TYPE_CHECKING:  # pragma: no cover
    from ._checkpointer import Checkpointer, DiffResult, GcResult, SaveHandle, current
    from ._fake_metadata import FakeMetadataServer
    from ._preemption import PreemptionNotice, PreemptionWatcher, detect_cloud
    from ._rng import rng_state, set_rng_state
    from ._s3 import S3Store

_LAZY = {
    "Checkpointer": "._checkpointer",
    "SaveHandle": "._checkpointer",
    "GcResult": "._checkpointer",
    "DiffResult": "._checkpointer",
    "current": "._checkpointer",
    "S3Store": "._s3",
    "rng_state": "._rng",
    "set_rng_state": "._rng",
    "PreemptionWatcher": "._preemption",
    "PreemptionNotice": "._preemption",
    "detect_cloud": "._preemption",
    "FakeMetadataServer": "._fake_metadata",
}


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(mod, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
