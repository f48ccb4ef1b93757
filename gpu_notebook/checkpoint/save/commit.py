"""The commit point of a save: its manifest, written create-only and last.

When several ranks write one checkpoint (a sharded save, or a replicated one with per-rank sections) every rank
but 0 writes a *record* of its part (its shard and/or per-rank section) and rank 0 gathers them into the one
manifest. The ranks then agree on the outcome through the store, with a deadline: a rank above 0 succeeds only
once it has seen the manifest of this very save (it names the save's nonce), fails when rank 0 writes the
attempt's *abort* record, and fails when neither comes within ``commit_timeout_s``; rank 0 fails the attempt
(and says so in the abort record) when a rank reports a failure or sends nothing in time. So a save succeeds on
every rank or fails on every rank, and a rank whose save failed never makes it the base of its next delta.

The agreement goes through the store, not a collective: the save runs on a background thread, and a collective
there would interleave with the training thread's own on the same process group (torch requires every rank to
issue a group's collectives in one order); it also works where there is no process group, or an NCCL one.

Every record and abort is named by the save's nonce (agreed by the ranks when the save starts) and the attempt
(a retry is a new attempt on every rank): rank 0 only takes the records of this attempt of this save, so a
record left by a crashed attempt, or by another run that used the same id, is never committed.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .._errors import CheckpointError, ObjectMissingError, StoreError
from ..format.manifest import FORMAT_NAME, SHARD_PREFIX, CheckpointInfo, manifest_key, read_manifest
from ..per_rank import split_section
from ..snapshot import Snapshot
from ..stores import Store
from .order import CommitOrder
from .spread import fill_remote_chunks, own_chunks

__all__ = ["Committer", "CommitFailedError", "writer_info"]

T = TypeVar("T")


class CommitFailedError(CheckpointError):
    """The ranks of a save did not all get their part committed (``retryable``: whether a new attempt of the
    save may still succeed; a rank that sent nothing within the deadline ends the save at once)."""

    def __init__(self, msg: str, retryable: bool = True) -> None:
        super().__init__(msg)
        self.retryable = retryable


@functools.cache
def _static_writer_info() -> dict[str, Any]:
    """What a manifest records about the code that wrote it, apart from the pid and torch (computed once:
    looking up the installed version reads package metadata, several milliseconds per save otherwise)."""
    info: dict[str, Any] = {
        "lib": "gpu_notebook.checkpoint",
        "python": platform.python_version(),
        "host": platform.node(),
        "program": os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "",
    }
    from importlib.metadata import PackageNotFoundError, version

    try:
        info["version"] = version("gpu_notebook")
    except PackageNotFoundError:  # run from a source tree that was never installed
        pass
    return info


def writer_info() -> dict[str, Any]:
    info = {**_static_writer_info(), "pid": os.getpid()}
    if "torch" in sys.modules:  # may be imported after the first save
        info["torch"] = sys.modules["torch"].__version__
    return info


def _attempt_prefix(ckpt_id: str, attempt: str) -> str:
    return f"{SHARD_PREFIX}{ckpt_id}/{attempt}/"


def _record_key(ckpt_id: str, attempt: str, rank: int) -> str:
    return f"{_attempt_prefix(ckpt_id, attempt)}rank-{rank:05d}.json"


def _abort_key(ckpt_id: str, attempt: str) -> str:
    return f"{_attempt_prefix(ckpt_id, attempt)}abort.json"


def _get_json(store: Store, key: str) -> dict[str, Any] | None:
    try:
        doc = json.loads(store.get(key))
    except ObjectMissingError:
        return None
    except ValueError:  # a partial write of a store without atomic writes: not there yet
        return None
    return doc if isinstance(doc, dict) else None


def _own(stats: dict[str, Any]) -> dict[str, Any]:
    return {k: stats[k] for k in ("raw_bytes", "new_bytes", "stall_s", "cpu_s") if k in stats}


@dataclass
class Committer:
    """Writes the manifest of a save (gathering the other ranks' records, when several ranks write it).

    One Committer serves the attempts of one save: :meth:`begin` starts each, then :meth:`commit` ends it, or
    :meth:`failed` tells the other ranks that this rank's part of it failed.
    """

    store: Store
    version: int  # the format version written
    rank: int
    world_size: int
    sharded: bool
    commit_timeout_s: float
    attempt: int = -1  # the attempt of the save under way (0 first)
    _told: int = field(default=-2, repr=False)  # the attempt whose failure the other ranks know of
    _final: CommitFailedError | None = field(default=None, repr=False)  # the save has failed for good
    _writers: bool = field(default=False, repr=False)
    _nonce: str = field(default="", repr=False)
    _ckpt_id: str = field(default="", repr=False)
    order: CommitOrder | None = None  # where the commit goes in the store's commit order (None: at ckpt_id)

    def _write_manifest(self, doc: dict[str, Any]) -> bool:
        # (no check for cycles: the manifest is a tree this library built; the check costs a quarter of the
        # encoding, 2-3 ms for a state of 10,000 tensors)
        data = json.dumps(doc, separators=(",", ":"), check_circular=False).encode()
        return self.store.put(manifest_key(str(doc["id"])), data, create_only=True)

    def begin(self, snap: Snapshot, ckpt_id: str) -> None:
        """A new attempt of the save of ``snap`` as ``ckpt_id``."""
        if self._final is not None:
            raise self._final
        self.attempt += 1
        self._writers = bool(getattr(snap, "writers", self.sharded)) and self.world_size > 1
        self._nonce = str(getattr(snap, "nonce", ""))
        self._ckpt_id = ckpt_id

    def attempts(self, snap: Snapshot, ckpt_id: str, once: Callable[[], T]) -> Callable[[], T]:
        """``once`` (one attempt of the save) as an attempt of every rank writing it: begun, and its failure told
        to the other ranks."""

        def attempt() -> T:
            self.begin(snap, ckpt_id)
            try:
                return once()
            except Exception as e:  # noqa: BLE001 - told to the other ranks writing this save, then re-raised
                self.failed(ckpt_id, e)
                raise

        return attempt

    @property
    def _name(self) -> str:
        """The name of this attempt of this save, the same on every rank."""
        return f"{self._nonce or 'a'}-{max(self.attempt, 0)}"

    def commit(
        self,
        snap: Snapshot,
        ckpt_id: str,
        shard: dict[str, Any],
        stats: dict[str, Any],
        is_base: bool,
        parent: str | None,
    ) -> CheckpointInfo | None:
        """Commit the save; its info (on every rank), or :class:`CommitFailedError` when it was not committed."""
        if self.attempt < 0 or self._ckpt_id != ckpt_id:
            self.begin(snap, ckpt_id)
        shard, section = split_section(shard, snap)
        if self._writers and self.rank != 0:
            rec: dict[str, Any] = {"attempt": self._name, "rank": self.rank, "stats": stats}
            if self.sharded:
                rec["shard"] = shard
            elif getattr(
                snap, "spread", False
            ):  # (rank 0 has the rest of the shard: it walked the same state)
                rec["chunks"] = own_chunks(shard)
            if section is not None:
                rec["section"] = section
            self._put_record(ckpt_id, rec)
            return self._await_outcome(ckpt_id)
        shards = [shard]
        sections = [] if section is None else [section]
        replicated = self.world_size == 1 or not self.sharded
        if self._writers:
            recs = self._gather(ckpt_id, stats)
            for rec in recs:
                if self.sharded:
                    shards.append(rec["shard"])
                if rec.get("section") is not None:
                    sections.append(rec["section"])
            if getattr(snap, "spread", False):
                try:
                    fill_remote_chunks(shard, {rec["rank"]: rec.get("chunks") or {} for rec in recs}, ckpt_id)
                except CheckpointError as e:
                    err = self._fail(str(e), retryable=False)
                    self.failed(ckpt_id, err)
                    raise err from None
        if self.sharded:
            sig = [{n: [c["raw"] for c in lf["chunks"]] for n, lf in s["leaves"].items()} for s in shards]
            replicated = all(s == sig[0] for s in sig) and all(s["tree"] == shards[0]["tree"] for s in shards)
        doc = {
            "format": FORMAT_NAME,
            "version": self.version,
            "id": ckpt_id,
            "step": snap.step,
            "created_at": snap.created_at,
            "committed_at": time.time(),
            "parent": parent,
            "is_base": is_base,
            "world_size": self.world_size,
            "sharded": self.sharded,
            "replicated": replicated,
            "writer": writer_info(),
            "stats": stats,
            "shards": shards,
        }
        if sections:
            doc["per_rank"] = sorted(sections, key=lambda s: int(s["rank"]))
        if self._writers:
            doc["attempt"] = self._name
        try:
            if self.order is not None:  # the next free place in the store's commit order (see order.py)
                got = self.order.commit(doc, self._write_manifest, movable=not self._writers)
                if got is None:  # the other ranks wait for this very id: the save fails on every rank
                    raise self._fail(
                        f"checkpoint {ckpt_id} not committed: another writer took its place in the commit order "
                        f"of {self.store.url}; the next save goes after it",
                        retryable=False,
                    )
                doc = got
            elif not self._write_manifest(doc):
                doc = self._ours_already(snap, ckpt_id)
        except Exception as e:  # noqa: BLE001 - any failure to commit is told to the other ranks, then raised
            self.failed(ckpt_id, e)
            raise
        if self._writers:
            for o in self.store.list(f"{SHARD_PREFIX}{ckpt_id}/"):
                self.store.delete(o.key)
        return CheckpointInfo.from_manifest(doc)

    def failed(self, ckpt_id: str, err: BaseException) -> None:
        """This rank's part of the current attempt failed with ``err``: tell the other ranks (rank 0 aborts the
        attempt; another rank sends a record saying so), unless they know already."""
        if not self._writers or self._told == self.attempt or self.attempt < 0:
            return
        self._told = self.attempt
        final = isinstance(err, CommitFailedError) and not err.retryable
        if self.rank == 0:
            key = _abort_key(ckpt_id, self._name)
            doc: dict[str, Any] = {"attempt": self._name, "error": str(err), "final": final}
        else:  # (where this rank's record is there already, rank 0 sees that one)
            key = _record_key(ckpt_id, self._name, self.rank)
            doc = {"attempt": self._name, "rank": self.rank, "failed": str(err), "final": final}
        try:
            self.store.put(key, json.dumps(doc).encode(), create_only=True)
        except Exception:  # noqa: BLE001 - the store is failing: the other ranks see nothing and time out
            pass

    def _put_record(self, ckpt_id: str, rec: dict[str, Any]) -> None:
        key = _record_key(ckpt_id, self._name, self.rank)
        data = json.dumps(rec, separators=(",", ":")).encode()
        if not self.store.put(key, data, create_only=True):
            # an earlier try of this very put whose answer was lost wrote the same bytes; anything else
            # there is not this save's
            if self.store.get(key) != data:
                raise self._fail(
                    f"checkpoint {ckpt_id}: {key} holds a record this save did not write; refusing to commit",
                    retryable=False,
                )

    def _fail(self, msg: str, retryable: bool, told: bool = False) -> CommitFailedError:
        """The error that ends this attempt (``retryable``: or the whole save); ``told``: the other ranks know
        of it already (it came from rank 0)."""
        err = CommitFailedError(msg, retryable)
        if not retryable:
            self._final = err
        if told:
            self._told = self.attempt
        return err

    def _committed(self, ckpt_id: str) -> dict[str, Any] | None:
        """The manifest of this save, if rank 0 has committed it (a manifest of that id naming another save is
        not: it belongs to another run that used the same id)."""
        if not self.store.exists(manifest_key(ckpt_id)):
            return None
        try:
            doc = read_manifest(self.store, ckpt_id)
        except CheckpointError:
            return None
        name = str(doc.get("attempt", ""))
        return doc if name.rsplit("-", 1)[0] == (self._nonce or "a") else None

    def _await_outcome(self, ckpt_id: str) -> CheckpointInfo:
        """A rank above 0, its record written: wait for rank 0's manifest of this save, or its abort."""
        deadline = time.monotonic() + self.commit_timeout_s
        delay = 0.02
        while True:
            try:  # the manifest first: an attempt whose abort raced its commit was committed
                doc = self._committed(ckpt_id)
                abort = None if doc is not None else _get_json(self.store, _abort_key(ckpt_id, self._name))
            except StoreError:  # the store failing for a while: ask again until the deadline
                doc = abort = None
            if doc is not None:
                return CheckpointInfo.from_manifest(doc)
            if abort is not None:
                raise self._fail(
                    f"checkpoint {ckpt_id} was not committed: rank 0 failed ({abort.get('error')})",
                    retryable=not abort.get("final"),
                    told=True,
                )
            if time.monotonic() > deadline:
                raise self._fail(
                    f"checkpoint {ckpt_id}: rank 0 did not commit it within {self.commit_timeout_s:.0f} s "
                    "(commit_timeout_s); the save failed on this rank",
                    retryable=False,
                    told=True,
                )
            time.sleep(delay)
            delay = min(0.5, delay * 2)

    def _gather(self, ckpt_id: str, stats: dict[str, Any]) -> list[dict[str, Any]]:
        """Rank 0: the other ranks' records of this attempt, from the store (their stats added to ``stats``)."""
        deadline = time.monotonic() + self.commit_timeout_s
        try:
            recs = [self._wait_record(ckpt_id, r, deadline) for r in range(1, self.world_size)]
        except CommitFailedError as e:
            self.failed(ckpt_id, e)
            raise
        # each rank's own figures (what its save took from it: the stall, the CPU time), then their sums
        stats["ranks"] = [{"rank": 0, **_own(stats)}] + [
            {"rank": r["rank"], **_own(r["stats"])} for r in recs
        ]
        for rec in recs:
            for k in ("raw_bytes", "new_bytes", "new_objects", "reused_bytes"):
                stats[k] += rec["stats"].get(k, 0)
        return recs

    def _wait_record(self, ckpt_id: str, r: int, deadline: float) -> dict[str, Any]:
        key = _record_key(ckpt_id, self._name, r)
        delay = 0.02
        while True:
            try:
                rec = _get_json(self.store, key)
            except StoreError:  # the store failing for a while: ask again until the deadline
                rec = None
            if rec is not None and rec.get("attempt") == self._name and rec.get("rank") == r:
                if "failed" in rec:
                    raise self._fail(
                        f"checkpoint {ckpt_id} was not committed: rank {r} failed ({rec['failed']})",
                        retryable=not rec.get("final"),
                    )
                return rec
            if time.monotonic() > deadline:
                raise self._fail(
                    f"checkpoint {ckpt_id}: rank {r} did not save its part within {self.commit_timeout_s:.0f} s "
                    "(commit_timeout_s); the checkpoint is not committed",
                    retryable=False,
                )
            time.sleep(delay)
            delay = min(0.5, delay * 2)

    def _ours_already(self, snap: Snapshot, ckpt_id: str) -> dict[str, Any]:
        """The manifest is there already. An earlier attempt of this very save may have been committed with its
        answer lost (a dropped connection after the server stored it): then it is ours, and committed; anything
        else is refused."""
        try:
            there = read_manifest(self.store, ckpt_id)
        except CheckpointError:
            there = None
        if not (
            there is not None
            and there.get("id") == ckpt_id
            and there.get("created_at") == snap.created_at
            and there.get("step") == snap.step
        ):
            raise CheckpointError(
                f"manifest {manifest_key(ckpt_id)} already exists; refusing to overwrite it"
            )
        return there
