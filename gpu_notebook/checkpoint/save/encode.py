"""Encoding the chunks of one save on the I/O threads: reuse a chunk already stored, else encode it (a delta
against the same chunk of the last full base, or of the previous checkpoint with ``delta_against="previous"``;
or in full) and upload it, big frames on their own and small ones
collected into packs that are uploaded as soon as they fill."""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._progress import Progress
from ..format._scratch import host_empty
from ..format.codec import encode_chunk
from ..format.manifest import check_fn, object_key
from ..stores import Store
from .lineage import Lineage
from .plan import Chunk, Plan

__all__ = ["SaveCounters", "ChunkEncoder"]

#: an encoding choice is reused for this many saves, then searched afresh
_HINT_SAVES = 8
#: frames waiting for their upload, per encoding thread (each is up to a chunk: the memory a slow store holds)
_UPLOADS_PER_THREAD = 2

Entry = dict[str, Any]


@dataclass
class SaveCounters:
    """What a save wrote and reused (updated from every I/O thread)."""

    new_bytes: int = 0
    new_objects: int = 0
    reused_bytes: int = 0
    cpu_s: float = 0.0  # CPU time the encoding threads spent on this save (their scheduler counters)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def wrote(self, nbytes: int) -> None:
        with self._lock:
            self.new_bytes += nbytes
            self.new_objects += 1

    def reused(self, nbytes: int) -> None:
        with self._lock:
            self.reused_bytes += nbytes

    def spent(self, cpu_s: float) -> None:
        with self._lock:
            self.cpu_s += cpu_s


class ChunkEncoder:
    """Encodes and uploads the chunks of one save; its methods run on many threads at once."""

    def __init__(
        self,
        plan: Plan,
        *,
        store: Store,
        hash_fn: Callable[[Any], str],
        level: int,
        pack_bytes: int,
        pack_at: int,
        lineage: Lineage,
        seq: int,
        progress: Progress,
        uploads: cf.ThreadPoolExecutor | None = None,
        threads: int = 2,
    ) -> None:
        self.plan = plan
        self.store = store
        self._h = hash_fn
        self._check = check_fn()  # the restore check of a chunk's raw bytes (``xxh3``), or None
        self.level = level
        self.pack_bytes = pack_bytes  # frames smaller than this go into packs
        self.pack_at = pack_at  # a pack is uploaded once it would grow past this
        self.hints = lineage.hints
        self.seq = seq
        self.progress = progress
        self.counters = SaveCounters()
        # uploads run on their own pool (I/O bound), so that the encoding threads go on encoding meanwhile; at
        # most _UPLOADS_PER_THREAD frames per encoding thread wait for theirs (the memory they hold is bounded)
        self.uploads = uploads
        self._uploading: list[cf.Future[None]] = []
        self._upload_lock = threading.Lock()
        self._upload_slots = threading.BoundedSemaphore(_UPLOADS_PER_THREAD * max(1, threads))
        self._claimed: dict[
            str, int
        ] = {}  # raw hash -> the chunk of this save that encodes it (tied weights)
        self._claim_lock = threading.Lock()
        self._pack: list[tuple[Entry, bytes]] = []
        self._pack_n = 0
        self._pack_lock = threading.Lock()

    def _put(self, key: str, blob: bytes | memoryview) -> None:
        if self.uploads is None:
            self._put_now(key, blob)
            return
        self._upload_slots.acquire()
        try:
            fut = self.uploads.submit(self._put_now, key, blob)
        except BaseException:
            self._upload_slots.release()
            raise
        fut.add_done_callback(lambda _f: self._upload_slots.release())
        with self._upload_lock:
            self._uploading.append(fut)

    def wait_uploads(self, cancel: bool = False) -> None:
        """Wait for every upload of this save (``cancel``: drop those not started); raise the first failure."""
        with self._upload_lock:
            futs, self._uploading = self._uploading, []
        if cancel:
            for f in futs:
                f.cancel()
            cf.wait(futs)
            return
        for f in futs:
            f.result()

    def _put_now(self, key: str, blob: bytes | memoryview) -> None:
        t0 = time.thread_time()
        try:
            self._put_store(key, blob)
        finally:
            if self.uploads is not None:  # (inline, the encoding thread's own count has it)
                self.counters.spent(time.thread_time() - t0)

    def _put_store(self, key: str, blob: bytes | memoryview) -> None:
        if self.store.put(key, blob, create_only=True):
            self.counters.wrote(len(blob))
        else:
            self.store.touch(key)  # found there: perhaps an orphan a concurrent gc is about to delete

    def _upload_pack(self, items: list[tuple[Entry, bytes]]) -> None:
        # the pack (up to pack_max_mb) in memory of its own, whose pages go back to the system once it is written
        # (format/_scratch.host_empty): a b"".join of it stayed in malloc's heaps between saves
        buf = host_empty(sum(len(f) for _, f in items))
        offs = []
        off = 0
        for _e, f in items:
            buf[off : off + len(f)] = np.frombuffer(f, dtype=np.uint8)
            offs.append(off)
            off += len(f)
        blob = buf.data
        key = object_key(self._h(blob))
        for (e, _f), o in zip(items, offs, strict=True):
            e.update(obj=key, off=o)
        self._put(key, blob)

    def _add_to_pack(self, entry: Entry, frame: bytes) -> None:
        full: list[tuple[Entry, bytes]] | None = None
        with self._pack_lock:
            if self._pack and self._pack_n + len(frame) > self.pack_at:
                full, self._pack, self._pack_n = self._pack, [], 0
            self._pack.append((entry, frame))
            self._pack_n += len(frame)
        if full:
            self._upload_pack(full)

    def flush(self) -> None:
        """Upload the last, partly filled pack (once every chunk is encoded)."""
        if self._pack:
            self._upload_pack(self._pack)
            self._pack, self._pack_n = [], 0

    def _reuse(self, c: Chunk, h: str) -> Entry | None:
        """The entry of a chunk with these bytes already stored, or claimed by an earlier chunk of this save."""
        reuse = self.plan.known.get(h)
        if reuse is None:
            with self._claim_lock:
                first = self._claimed.setdefault(h, c.k)
            if first != c.k:
                reuse = {"$same": first}
        return reuse

    def encode(self, c: Chunk) -> tuple[int, Entry]:
        """Reuse, or encode and upload, one chunk; returns its position and manifest entry."""
        base_arr, base_entry = c.base_arr, c.base_entry
        if (
            c.check
            and base_arr is not None
            and base_entry is not None
            and self._h(base_arr.data) != base_entry["raw"]
        ):
            # restored bytes that were changed in place since: no delta against them
            base_arr = base_entry = None
        raw = c.raw
        h = self._h(raw.data)
        reuse = self._reuse(c, h)
        if reuse is not None:
            self.counters.reused(c.len)
            self.progress.add(c.len)
            return c.k, reuse
        # a chunk reuses the encoding chosen for it by an earlier save (the best transform, order and
        # rotation of a tensor change slowly); the choice is searched afresh every few saves
        kind = (c.leaf.name, c.idx, c.leaf.dtype, base_arr is not None)
        cached = self.hints.get(kind)
        hint = cached[0] if cached is not None and self.seq - cached[1] < _HINT_SAVES else None
        chosen: dict[str, Any] = {}
        frame, t = encode_chunk(raw, c.leaf.width, base_arr, level=self.level, hint=hint, chosen=chosen)
        if hint is None and "hint" in chosen:
            self.hints[kind] = (chosen["hint"], self.seq)
        entry: Entry = {"raw": h, "len": c.len, "t": t, "size": len(frame)}
        if self._check is not None:
            entry["xxh3"] = self._check(raw.data)
        if t in ("xor", "sub") and base_entry is not None:
            entry["base"] = base_entry
            entry["depth"] = int(base_entry.get("depth", 0)) + 1
        else:
            entry["depth"] = 0
        fh = self._h(frame)
        entry["hash"] = fh
        if len(frame) >= self.pack_bytes:
            key = object_key(fh)
            entry.update(obj=key, off=0)
            self._put(key, frame)
        else:
            self._add_to_pack(entry, frame)
        self.progress.add(c.len)
        return c.k, entry

    def encode_all(self, chunks: list[Chunk]) -> list[tuple[int, Entry]]:
        t0 = time.thread_time()  # this thread's CPU time (CLOCK_THREAD_CPUTIME_ID): what the save takes
        try:
            return [self.encode(c) for c in chunks]
        finally:
            self.counters.spent(time.thread_time() - t0)
