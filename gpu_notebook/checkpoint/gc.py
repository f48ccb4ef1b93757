"""Deleting old checkpoints and the objects no kept checkpoint needs, safely beside saves that are running."""

from __future__ import annotations

import time

from ._errors import CheckpointError, FormatVersionError, NoCheckpointError, ObjectMissingError
from .format.manifest import (
    MANIFEST_PREFIX,
    OBJECT_PREFIX,
    SHARD_PREFIX,
    id_from_key,
    manifest_key,
    manifest_objects,
    read_manifest,
)
from .inspect import Inspector
from .results import GcResult

__all__ = ["collect"]


def _refuse(cid: str, err: CheckpointError) -> CheckpointError:
    return CheckpointError(
        f"gc refused, nothing deleted: manifest {manifest_key(cid)} cannot be read ({err}), so the objects "
        f"it needs are unknown. "
        + (
            "It was written by a newer version of gpu_notebook: run gc with that version."
            if isinstance(err, FormatVersionError)
            else "Restore or delete that checkpoint by hand first."
        )
    )


def collect(inspector: Inspector, keep: int, grace_s: float, dry_run: bool) -> GcResult:
    """Delete all but the newest ``keep`` checkpoints and every object none of them needs (see
    :meth:`Checkpointer.gc`)."""
    store = inspector.store
    lst = inspector.list()
    for bad, err in inspector.unreadable:
        if not isinstance(err, NoCheckpointError | ObjectMissingError):  # (gone since it was listed)
            raise _refuse(bad, err) from err
    kept, drop = lst[-keep:], lst[:-keep]
    needed: set[str] = set()
    for c in kept:
        needed |= manifest_objects(read_manifest(store, c.id))
    res = GcResult(kept=[c.id for c in kept])
    for c in drop:
        if not dry_run:
            store.delete(manifest_key(c.id))
        res.manifests.append(c.id)
    now = time.time()
    # re-read after deleting: a manifest committed meanwhile protects its objects (one that cannot be read
    # stops gc before any object is deleted)
    for o in store.list(MANIFEST_PREFIX):
        cid = id_from_key(o.key)
        if cid and cid not in res.kept and cid not in res.manifests:
            try:
                needed |= manifest_objects(read_manifest(store, cid))
            except (NoCheckpointError, ObjectMissingError):
                continue  # deleted since it was listed
            except CheckpointError as e:
                raise _refuse(cid, e) from e
    for o in store.list(OBJECT_PREFIX):
        if o.key in needed or now - o.mtime < grace_s:
            continue
        if not dry_run:
            store.delete(o.key)
        res.objects.append(o.key)
        res.bytes += o.size
    for o in store.list(SHARD_PREFIX):
        if now - o.mtime >= grace_s and not dry_run:
            store.delete(o.key)
    return res
