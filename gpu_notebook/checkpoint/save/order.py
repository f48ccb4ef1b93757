"""A writer's place in a store's commit order: the sequence number of its next commit and the checkpoint that
commit continues (its ``parent``).

Every commit takes the next place after the store's highest, and takes it create-only: its manifest's key is
``manifests/c<seq>.json``, so two writers on one prefix (two notebooks) can never both commit at one place. A
writer lists ``manifests/`` before each commit (one listing: a place taken by another writer since the last
commit is seen there); one that loses the race between its listing and its write finds the key taken and moves on
to the next free place. Either way it warns: two writers on one prefix make two branches, and a resume restores
whichever committed last. The highest place in a store only grows: ``gc`` never deletes the newest commit.
"""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Callable
from typing import Any

from .._errors import CheckpointError, NoCheckpointError
from ..format.manifest import (
    FORMAT_NAME,
    MANIFEST_PREFIX,
    commit_id,
    id_from_key,
    read_manifest,
    seq_of,
)
from ..stores import Store

__all__ = ["COMMIT_TRIES", "CommitOrder"]

log = logging.getLogger("gpu_notebook.checkpoint")

#: how many places a commit tries before giving up (each lost place is another writer's commit that landed
#: between this writer's listing and its write; every try lists again, so one try is one lost race, however
#: many commits landed). The experimental DCP writer (``checkpoint/dcp.py``) commits under this same bound.
COMMIT_TRIES = 16


class CommitOrder:
    """Where this writer's next commit goes and what it continues.

    Parameters
    ----------
    store
        The store the commits go to.
    version
        The format version this writer writes; the store's ``FORMAT`` marker is raised to it at the first commit
        (a reader too old for commit order then refuses the store instead of resuming a wrong checkpoint).
    """

    def __init__(self, store: Store, version: int) -> None:
        self.store = store
        self.version = version
        #: the checkpoint the next commit continues: the last one committed or restored (None: a new root)
        self.parent: str | None = None
        self._next: int | None = None  # the next place, once learned from a listing
        self._marker_done = False

    def highest(self) -> int:
        """The highest place taken in the store (-1 when it holds no commit, only format-3 checkpoints or
        nothing): one listing."""
        seqs = [s for o in self.store.list(MANIFEST_PREFIX) if (s := seq_of(id_from_key(o.key))) is not None]
        return max(seqs, default=-1)

    def propose(self) -> int:
        """The place of the next save, as far as this writer knows (a listing at the first save and after a
        restore; then counting up). The commit checks it again."""
        if self._next is None:
            self._next = self.highest() + 1
        seq = self._next
        return seq

    def proposed(self, seq: int) -> None:
        """A save was started at ``seq`` (the agreed place of a sharded save may be above this rank's)."""
        self._next = seq + 1

    def restored(self, doc: dict[str, Any]) -> None:
        """A checkpoint was restored: the next commit continues it, after the store's newest."""
        self.parent = str(doc["id"])
        self._next = None

    def commit(
        self, doc: dict[str, Any], write: Callable[[dict[str, Any]], bool], movable: bool = True
    ) -> dict[str, Any] | None:
        """Commit ``doc`` (a manifest whose ``id`` is a proposed commit id) at the first free place from its
        own: sets its ``seq``, ``id`` and ``parent`` and calls ``write(doc)`` (a create-only put of its manifest:
        False when the key is taken). Returns the committed manifest, which is an earlier attempt's of this very
        save when that was committed with its answer lost; or None when the place is taken and the commit may
        not move (``movable`` False: other ranks wait for the manifest under the proposed id), and then the next
        save of this writer learns the store's places afresh."""
        seq = seq_of(str(doc["id"]))
        if seq is None:
            raise ValueError(f"not a commit id: {doc['id']!r}")
        self._raise_marker()
        doc = {**doc, "parent": self.parent}
        others: list[str] = []
        for _ in range(COMMIT_TRIES):
            taken = self._taken_from(seq)
            for cid in taken:
                there = self._read(cid)
                if there is not None and _same_save(there, doc):
                    return self._committed(there)  # committed by an earlier attempt whose answer was lost
                others.append(cid)
            if taken and not movable:
                self._next = None
                return None
            if taken:
                seq = max(seq_of(c) or 0 for c in taken) + 1
            doc["seq"], doc["id"] = seq, commit_id(seq)
            if write(doc):
                if others:
                    _warn_other_writer(self.store.url, others, doc["id"])
                return self._committed(doc)
            # taken between the listing and the write: list again (it is seen there now)
        raise CheckpointError(
            f"checkpoint of step {doc.get('step')} not committed: {COMMIT_TRIES} places in the commit order of "
            f"{self.store.url} were taken by other writers while it tried them"
        )

    def _committed(self, doc: dict[str, Any]) -> dict[str, Any]:
        self.parent = str(doc["id"])
        self._next = int(doc["seq"]) + 1
        return doc

    def _taken_from(self, seq: int) -> list[str]:
        """The commit ids at ``seq`` and above in the store, lowest first."""
        ids = [cid for o in self.store.list(MANIFEST_PREFIX) if (cid := id_from_key(o.key)) is not None]
        return sorted(cid for cid in ids if (s := seq_of(cid)) is not None and s >= seq)

    def _read(self, cid: str) -> dict[str, Any] | None:
        try:
            return read_manifest(self.store, cid)
        except NoCheckpointError:
            return None  # deleted since it was listed: its place stays taken all the same
        except CheckpointError as e:
            log.warning("manifest of %s cannot be read (%s); its place is taken all the same", cid, e)
            return None

    def _raise_marker(self) -> None:
        """Raise the store's ``FORMAT`` marker to this writer's version (once), before its first commit."""
        if self._marker_done:
            return
        try:
            have = json.loads(self.store.get("FORMAT")).get("version")
        except (CheckpointError, ValueError, AttributeError):
            have = None
        if isinstance(have, int) and have < self.version:
            marker = {"format": FORMAT_NAME, "version": self.version}
            self.store.put("FORMAT", json.dumps(marker).encode(), create_only=False)
        self._marker_done = True


def _same_save(there: dict[str, Any], doc: dict[str, Any]) -> bool:
    """Whether the manifest ``there`` is an earlier attempt of the save ``doc`` commits."""
    w1, w2 = there.get("writer") or {}, doc.get("writer") or {}
    return (
        there.get("created_at") == doc.get("created_at")
        and there.get("step") == doc.get("step")
        and (w1.get("host"), w1.get("pid")) == (w2.get("host"), w2.get("pid"))
    )


def _warn_other_writer(url: str, others: list[str], got: str) -> None:
    msg = (
        f"another writer committed to {url} at the same time ({', '.join(others[:3])}"
        f"{' ...' if len(others) > 3 else ''}); this checkpoint is committed after it, as {got}. Two writers on "
        "one store make two branches, and a resume restores whichever committed last: give each run its own "
        "store (or prefix)"
    )
    log.warning(msg)
    warnings.warn(msg, RuntimeWarning, stacklevel=2)
