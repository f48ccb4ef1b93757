"""Exceptions raised by :mod:`gpu_notebook.checkpoint`.

Every error names what it is about (checkpoint id, tensor, chunk, object key) so a user can act on it.
"""

from __future__ import annotations

from gpu_notebook.errors import GpuNotebookError

__all__ = [
    "CheckpointError",
    "StoreError",
    "ObjectMissingError",
    "IntegrityError",
    "FormatVersionError",
    "ShapeMismatchError",
    "NoCheckpointError",
    "CheckpointSaveError",
    "UnsafeValueError",
]


class CheckpointError(GpuNotebookError, Exception):
    """Base class of every checkpoint error."""


class StoreError(CheckpointError):
    """The store cannot be reached or used (missing bucket, access denied, endpoint down)."""


class ObjectMissingError(CheckpointError, KeyError):
    """An object (chunk, pack or manifest) that should exist is missing from the store."""

    def __init__(self, key: str, detail: str = "") -> None:
        self.key = key
        msg = f"object {key!r} is missing from the store"
        if detail:
            msg += f" ({detail})"
        super().__init__(msg)

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


class IntegrityError(CheckpointError):
    """Stored bytes do not match their recorded hash (corruption, truncation, tampering)."""


class FormatVersionError(CheckpointError):
    """The store or a manifest uses a format version this library cannot read."""


class ShapeMismatchError(CheckpointError, ValueError):
    """Restoring into objects that do not match the checkpoint: their types (a tensor where a module was saved,
    an SGD optimizer for an Adam one), keys, tensor shapes or dtypes. Nothing was loaded."""

    def __init__(self, mismatches: list[tuple[str, object, object]]) -> None:
        self.mismatches = mismatches
        lines = [f"  {name}: checkpoint {a}, target {b}" for name, a, b in mismatches[:20]]
        more = f"\n  ... and {len(mismatches) - 20} more" if len(mismatches) > 20 else ""
        super().__init__(
            f"{len(mismatches)} mismatch(es) between the checkpoint and the restore target (nothing was loaded):\n"
            + "\n".join(lines)
            + more
        )


class NoCheckpointError(CheckpointError, LookupError):
    """No (matching) checkpoint exists in the store."""


class CheckpointSaveError(CheckpointError):
    """A background save failed after all its retries."""


class UnsafeValueError(CheckpointError, TypeError):
    """A value cannot be stored in the safe (non-pickle) format, or a pickled value is refused on restore."""
