"""Leases: what a save in flight reuses of the store, so that a ``gc`` in another process (a second notebook on
the same prefix) keeps it.

A save reuses objects it does not write: the unchanged chunks and delta bases of the checkpoints its deltas are
computed against (its *sources*: the last base, and the last save). Before it reuses anything it writes a lease,
``leases/<name>.json`` (create-only), naming those sources and their objects, with an expiry; it renews the lease
while it runs and deletes it when it ends (committed or failed). Then it checks that each source's manifest still
exists: a source that is gone (deleted by a gc) is not reused, and the save writes what it needs afresh.

``gc`` deletes manifests, lists the ones left, then reads the leases, then deletes objects: it keeps every object
a live lease names and every object written since a live lease began. Why that closes the race (the argument is
also in ``docs/checkpoint-format.md``): if gc deletes an object a save reuses, the source that references it was
gone when gc listed the manifests left, and the lease was not there when gc read the leases, later; so the lease
was written after that, and the save's check, after its lease, found the source gone and did not reuse it.

The only object a lease overwrites is itself (its renewal); every other write to a store stays create-only.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from .._errors import ObjectMissingError
from ..format.manifest import FORMAT_NAME, LEASE_PREFIX, manifest_key, walk_chunks
from ..stores import Store
from .lineage import Lineage

__all__ = ["LEASE_TTL_S", "Lease", "LiveLeases", "hold_lease", "read_leases"]

log = logging.getLogger("gpu_notebook.checkpoint")

#: a lease not renewed for this long is dead (its writer is gone); a live writer renews it every third of that
LEASE_TTL_S = 600.0
#: how far apart the clocks of two machines on one store may be (an expiry, and objects written just before a
#: lease began, are judged with this much slack)
CLOCK_SLACK_S = 120.0


def lease_key(name: str) -> str:
    return f"{LEASE_PREFIX}{name}.json"


def _entry_objects(entries: Any) -> set[str]:
    return {e["obj"] for c in entries for e in walk_chunks(c)}


class Lease:
    """One save's lease in ``store``: written by :meth:`take`, renewed on a thread, deleted by :meth:`release`."""

    def __init__(
        self, store: Store, name: str, manifests: list[str], objects: set[str], ttl_s: float = LEASE_TTL_S
    ) -> None:
        self.store = store
        self.key = lease_key(name)
        self.name = name
        self.manifests = manifests
        self.objects = objects
        self.ttl_s = ttl_s
        self.started_at = time.time()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def _doc(self) -> bytes:
        doc = {
            "format": FORMAT_NAME,
            "lease": self.name,
            "manifests": sorted(self.manifests),
            "objects": sorted(self.objects),
            "started_at": self.started_at,
            "expires_at": time.time() + self.ttl_s,
        }
        return json.dumps(doc, separators=(",", ":")).encode()

    def take(self) -> None:
        """Write the lease (create-only: its name is unique) and start renewing it."""
        self.store.put(self.key, self._doc(), create_only=True)
        self._thread = threading.Thread(target=self._renew_loop, name="gnb-ckpt-lease", daemon=True)
        self._thread.start()

    def narrow(self, manifests: list[str], objects: set[str]) -> None:
        """Name only these sources and objects from now on (those no longer reused need no keeping)."""
        with self._lock:
            self.manifests, self.objects = manifests, objects
            self.store.put(self.key, self._doc(), create_only=False)

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            try:
                with self._lock:
                    if not self._stop.is_set():
                        self.store.put(self.key, self._doc(), create_only=False)
            except Exception as e:  # noqa: BLE001 - a failed renewal is retried; the save itself goes on
                log.warning("checkpoint lease %s could not be renewed (%s); retrying", self.key, e)

    def release(self) -> None:
        """Stop renewing and delete the lease."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            self.store.delete(self.key)


@contextmanager
def hold_lease(
    store: Store, ckpt_id: str, rank: int, lineage: Lineage, ttl_s: float = LEASE_TTL_S
) -> Iterator[Lease]:
    """Hold a lease on what the save ``ckpt_id`` of ``rank`` reuses, for the duration of the ``with`` block; a
    source whose manifest is gone is dropped from ``lineage`` first (the save then writes a full base, or
    reuses only the other source)."""
    shadow_id = lineage.shadow_id if lineage.shadow else None
    recent_id = lineage.parent if lineage.recent else None
    shadow_objs = _entry_objects(c for sh in lineage.shadow.values() for c in sh["chunks"])
    recent_objs = _entry_objects(lineage.recent.values())
    sources = [s for s in dict.fromkeys([shadow_id, recent_id]) if s is not None]
    name = f"{ckpt_id}-r{rank}-{uuid.uuid4().hex[:8]}"
    lease = Lease(store, name, sources, shadow_objs | recent_objs, ttl_s)
    lease.take()
    try:
        gone = [s for s in sources if not store.exists(manifest_key(s))]
        if gone or (lineage.shadow and shadow_id is None):
            # (a shadow of unknown origin cannot be checked: it is not reused either)
            log.warning(
                "checkpoint %s: what it continues (%s) was deleted, by a gc, since this writer saved or restored "
                "it; this save reuses nothing of it and writes what it needs afresh",
                ckpt_id,
                ", ".join(gone) or "the checkpoint its deltas are computed against",
            )
            if shadow_id in gone or shadow_id is None:
                lineage.shadow = {}
                shadow_objs = set()
            if recent_id in gone:
                lineage.recent = {}
                recent_objs = set()
            lease.narrow([s for s in sources if s not in gone], shadow_objs | recent_objs)
        yield lease
    finally:
        lease.release()


@dataclass
class LiveLeases:
    """The leases of a store as ``gc`` reads them."""

    manifests: set[str] = field(default_factory=set)  # checkpoints a live lease continues: not deleted
    objects: set[str] = field(default_factory=set)  # objects a live lease reuses: not deleted
    since: float | None = None  # objects written from this time on may be a live save's own: not deleted
    expired: list[str] = field(default_factory=list)  # keys of dead leases (gc deletes them)
    live: int = 0


def read_leases(store: Store, now: float | None = None) -> LiveLeases:
    """Every lease in ``store``: what the live ones need, and which are dead (expired, by the writer's clock
    with :data:`CLOCK_SLACK_S` of slack; an unreadable one by its age)."""
    now = time.time() if now is None else now
    out = LiveLeases()
    for o in store.list(LEASE_PREFIX):
        try:
            doc: Any = json.loads(store.get(o.key))
        except ObjectMissingError:
            continue  # released since it was listed
        except ValueError:
            doc = None
        if not isinstance(doc, dict) or not isinstance(doc.get("expires_at"), int | float):
            # a damaged lease: it protects nothing it names, but the objects of its time, until it is old
            if now - o.mtime > LEASE_TTL_S + CLOCK_SLACK_S:
                out.expired.append(o.key)
            else:
                out.live += 1
                start = o.mtime - CLOCK_SLACK_S
                out.since = start if out.since is None else min(out.since, start)
            continue
        if now > float(doc["expires_at"]) + CLOCK_SLACK_S:
            out.expired.append(o.key)
            continue
        out.live += 1
        out.manifests.update(str(m) for m in doc.get("manifests", []))
        out.objects.update(str(k) for k in doc.get("objects", []))
        start = float(doc.get("started_at", o.mtime)) - CLOCK_SLACK_S
        out.since = start if out.since is None else min(out.since, start)
    return out
