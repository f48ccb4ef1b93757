"""Opening a store only to read it (the command line, :func:`export`), and :func:`export` itself."""

from __future__ import annotations

import os
from typing import Any

from ._export import ExportResult, export_state
from .checkpointer import Checkpointer
from .options import DistributedOptions, PolicyOptions, RuntimeOptions, StorageOptions
from .stores import Store

__all__ = ["export", "open_reader"]


def open_reader(
    store: str | os.PathLike[str] | Store, endpoint_url: str | None = None, progress: Any = False
) -> Checkpointer:
    """A read-only :class:`Checkpointer` of ``store`` as one process of one (never the current one, no
    preemption watcher): it lists, shows, restores and exports, and writes nothing."""
    return Checkpointer(
        store,
        storage=StorageOptions(read_only=True, endpoint_url=endpoint_url or None),
        policy=PolicyOptions(preemption=None),
        distributed=DistributedOptions(rank=0, world_size=1),
        runtime=RuntimeOptions(progress=progress, current=False),
    )


def export(
    store_or_path: str | os.PathLike[str] | Store | Checkpointer,
    checkpoint_id: str | None,
    dest: str | os.PathLike[str],
    select: str | None = None,
    format: str | None = None,
    *,
    endpoint_url: str | None = None,
) -> ExportResult:
    """Write checkpoint ``checkpoint_id`` (an id, a unique prefix of one, ``"latest"`` or None) of a store, or its
    sub-tree ``select`` (a key path: ``"model"``, ``"model.encoder"``), to ``dest``: a ``.safetensors`` file or a
    ``torch.save`` file (``.pt``, ``.pth``) that loads with ``torch.load(..., weights_only=True)``. ``format``
    (``"safetensors"`` or ``"torch"``) overrides the suffix. See "Exports and the command line" in
    ``docs/checkpoint.md`` (tied weights, what is left out)."""
    if isinstance(store_or_path, Checkpointer):
        return export_state(store_or_path, checkpoint_id, dest, select, format)
    ck = open_reader(store_or_path, endpoint_url)
    try:
        return export_state(ck, checkpoint_id, dest, select, format)
    finally:
        ck.close(wait=False)
