"""Deleting old checkpoints and the objects no kept checkpoint needs, safely beside saves that are running (in
this process or another: their leases, see ``save/lease.py``, say what they reuse).

What is kept: the newest ``keep`` commits of the live branch (the newest commit and those it continues), every
checkpoint a live lease continues, with ``keep_abandoned`` every checkpoint of an abandoned branch, and every
object any of them needs (the bases of their delta chains included). The order of the steps matters: manifests
are deleted first, then the ones left are listed, then the leases are read, then objects are deleted.
"""

from __future__ import annotations

import time

from ._errors import CheckpointError, FormatVersionError, NoCheckpointError, ObjectMissingError
from .format.manifest import (
    MANIFEST_PREFIX,
    OBJECT_PREFIX,
    SHARD_PREFIX,
    CheckpointInfo,
    id_from_key,
    manifest_key,
    manifest_objects,
    read_manifest,
)
from .inspect import Inspector
from .results import GcResult
from .save.lease import read_leases

__all__ = ["collect", "choose_kept"]


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


def choose_kept(
    lst: list[CheckpointInfo], keep: int, keep_abandoned: bool, leased: set[str]
) -> tuple[list[CheckpointInfo], list[CheckpointInfo]]:
    """(kept, dropped) of a listing in commit order: the newest ``keep`` of the live branch, the leased ones,
    and with ``keep_abandoned`` the abandoned branches."""
    live = [c for c in lst if c.branch == "live"]
    keep_ids = {c.id for c in live[-keep:]} | leased
    if keep_abandoned:
        keep_ids |= {c.id for c in lst if c.branch != "live"}
    kept = [c for c in lst if c.id in keep_ids]
    return kept, [c for c in lst if c.id not in keep_ids]


def collect(
    inspector: Inspector, keep: int, grace_s: float, dry_run: bool, keep_abandoned: bool = False
) -> GcResult:
    """Delete what :meth:`Checkpointer.gc` deletes (see there and the module docstring)."""
    store = inspector.store
    before = read_leases(store)  # a checkpoint a save in flight continues is not deleted
    lst = inspector.list()
    for bad, err in inspector.unreadable:
        if not isinstance(err, NoCheckpointError | ObjectMissingError):  # (gone since it was listed)
            raise _refuse(bad, err) from err
    kept, drop = choose_kept(lst, keep, keep_abandoned, before.manifests)
    needed: set[str] = set()
    for c in kept:
        needed |= manifest_objects(read_manifest(store, c.id))
    res = GcResult(kept=[c.id for c in kept])
    for c in drop:
        if not dry_run:
            store.delete(manifest_key(c.id))
        res.manifests.append(c.id)
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
    # then the leases, after the manifests: a save whose lease is not seen here checks its sources after
    # writing its lease, so it finds the ones deleted above gone and does not reuse their objects
    leases = read_leases(store)
    needed |= leases.objects
    now = time.time()
    res.grace_s = grace_s
    for o in store.list(OBJECT_PREFIX):
        if o.key in needed:
            continue
        if now - o.mtime < grace_s or (leases.since is not None and o.mtime >= leases.since):
            res.young += 1  # perhaps written (or found and touched) by a save in flight
            res.young_bytes += o.size
            continue
        if not dry_run:
            store.delete(o.key)
        res.objects.append(o.key)
        res.bytes += o.size
    if not dry_run:
        for o in store.list(SHARD_PREFIX):
            if now - o.mtime >= grace_s:
                store.delete(o.key)
        for key in leases.expired:  # their writers are gone
            store.delete(key)
    res.leases = leases.live
    return res
