"""Decoding one shard of a checkpoint into fresh host memory.

Every chunk is one chain of frames (a full frame, then the deltas on it, oldest first), decoded in place into the
memory of the tensor handed back: the base frame into it, then each delta over it. The same bytes twice (tied
weights) are decoded once and copied.

Read-ahead: every frame this restore needs, grouped into ranged reads of nearby frames of one object (at most
``pack_max`` bytes, gaps under ``_GAP_BYTES``; at most the store's ``read_bytes`` from an object it says is not
cached, e.g. a local file after a restart, which it reads ahead as a whole), requested at once by their own pool
(I/O bound: as many in flight as the store allows), in the order the chains need them (the biggest chains first;
a chain's base and its delta together); a read's bytes are dropped once its last frame is decoded. (Reads from S3
are not split further: a save's several packs already come down in parallel, and some S3-compatible servers read
a whole object for every ranged GET.)

A chain's next frame is decoded as soon as its bytes are here, by whichever thread is free; a thread goes on with
the same chain while it can (its bytes are still in the cache). With a warm local store everything is here at
once: each chain is decoded start to end in one go; from S3 or a cold disk chains are done one after another
while later reads are still coming in.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from .._errors import CheckpointError, IntegrityError, ObjectMissingError
from .._progress import Progress
from ..format._scratch import heap_empty
from ..format.codec import decode_chunk
from ..format.manifest import check_fn, doc_hash, hash_fn, walk_chunks
from ..format.tree import GROUP_PREFIX, leaf_from_bytes
from ..format.validate import check_restore
from ..stores import Store

__all__ = ["decode_shard"]

#: restore reads frames of one object separated by at most this many unneeded bytes with one ranged GET (a
#: request costs a round trip, about what a few MB take to arrive)
_GAP_BYTES = 4 << 20
#: chains of chunks under this many bytes are decoded one after another by one task (see ``save.persist``)
_TINY_BYTES = 64 * 1024

Entry = dict[str, Any]


class _Chain:
    """One chunk to restore: its frames (a full one, then the deltas on it), decoded in turn into ``dst``."""

    __slots__ = ("name", "idx", "entry", "chain", "dst", "level", "groups")

    def __init__(self, name: str, idx: int, entry: Entry, chain: list[Entry], dst: np.ndarray):
        self.name = name
        self.idx = idx
        self.entry = entry  # the end of the chain (what the manifest lists)
        self.chain = chain  # oldest first
        self.dst = dst
        self.level = 0  # the next frame to decode
        self.groups: list[int] = []  # the read that brings each frame


def decode_shard(
    doc: dict[str, Any],
    shard: dict[str, Any],
    *,
    store: Store,
    threads: int,
    pack_max: int,
    progress: Any,
    verify: bool,
    allow_pickle: bool,
    pools: tuple[cf.ThreadPoolExecutor, cf.ThreadPoolExecutor] | None = None,
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The leaves of ``shard`` decoded: (leaf name -> value, leaf name -> its bytes). ``pools``: the (decode,
    fetch) thread pools to use (idle ones: a restore's workers wait for frames), else they are started for it."""
    check_restore(doc, shard)  # every size the manifest claims, and the memory they need, before allocating
    leaves = shard["leaves"]
    if not allow_pickle:  # refuse pickles before fetching anything
        for name, lf in leaves.items():
            if lf.get("kind") == "pickle":
                leaf_from_bytes({**lf, "name": name}, np.zeros(0, np.uint8), allow_pickle=False)
    prog = Progress(f"restore {doc['id']}", sum(lf["nbytes"] for lf in leaves.values()), progress)
    dec = _ShardDecoder(doc, store, threads, pack_max, verify, pools)
    # a group (small tensors saved together) is decoded as one tensor; its members are views of its bytes
    groups = shard.get("groups") or {}
    encoded = {name: lf for name, lf in leaves.items() if "group" not in lf}
    encoded.update((GROUP_PREFIX + key, g) for key, g in groups.items())
    members: dict[str, list[tuple[str, Entry]]] = {key: [] for key in groups}
    for name, lf in leaves.items():
        if "group" in lf:
            members[lf["group"]].append((name, lf))
    for key, mem in members.items():
        few = ", ".join(repr(m) for m, _ in mem[:3]) + (f" and {len(mem) - 3} more" if len(mem) > 3 else "")
        dec.labels[GROUP_PREFIX + key] = f"the group of {len(mem)} small {key} tensors ({few})"
    dec.plan(encoded)
    dec.run(prog)
    values = {
        name: leaf_from_bytes({**lf, "name": name}, dec.datas[name], allow_pickle=allow_pickle)
        for name, lf in encoded.items()
        if name in leaves
    }
    for key, mem in members.items():
        if mem:
            values.update(_members(dec.datas[GROUP_PREFIX + key], groups[key]["dtype"], mem))
    return values, dec.datas


def _members(data: np.ndarray, dtype: str, mem: list[tuple[str, Entry]]) -> Iterator[tuple[str, Any]]:
    """The tensors of a group's members: views of its decoded bytes (one ``torch.split`` when they lie one after
    the other, as a writer lays them out; else a slice each)."""
    import torch

    tdt = getattr(torch, dtype)
    size = tdt.itemsize
    offs = [int(lf["goff"]) for _, lf in mem]
    counts = [int(lf["nbytes"]) // size for _, lf in mem]
    if offs[0] == 0 and all(o == a + n * size for o, a, n in zip(offs[1:], offs, counts, strict=False)):
        flat = torch.from_numpy(data).view(tdt)
        pieces = torch.split(flat[: sum(counts)], counts)
        for (name, lf), t in zip(mem, pieces, strict=True):
            shape = lf["shape"]
            yield name, t if len(shape) == 1 else t.view(shape)
        return
    for (name, lf), o in zip(
        mem, offs, strict=True
    ):  # pragma: no cover - no writer lays a group out otherwise
        yield name, leaf_from_bytes({**lf, "name": name}, data[o : o + int(lf["nbytes"])])


class _ShardDecoder:
    """The chains of one shard, the reads that bring their frames, and the threads that decode them."""

    def __init__(
        self,
        doc: dict[str, Any],
        store: Store,
        threads: int,
        pack_max: int,
        verify: bool,
        pools: tuple[cf.ThreadPoolExecutor, cf.ThreadPoolExecutor] | None = None,
    ) -> None:
        self.doc = doc
        self.pools = pools  # (decode, fetch) thread pools to use, or None: start them for this restore
        self.store = store
        self.threads = threads
        self.pack_max = pack_max
        self.verify = verify
        self.hv = hash_fn(doc_hash(doc))  # the hash this checkpoint was written with
        self.check = check_fn()  # the fast check of decoded bytes (a chunk's ``xxh3``), or None
        self.datas: dict[str, np.ndarray] = {}
        self.labels: dict[str, str] = {}  # how errors name a group (of small tensors saved together)
        self.chains: list[_Chain] = []
        self.copies: list[
            tuple[_Chain, np.ndarray]
        ] = []  # (the chain that decodes these bytes, another home)
        self.groups: list[tuple[str, int, int]] = []  # object, start, end of each ranged read
        self.group_of: dict[tuple[str, int], int] = {}  # (object, frame offset) -> its read
        self.left: list[int] = []  # frames of each read still to decode
        self.futures: dict[int, cf.Future[bytes | memoryview]] = {}
        self._left_lock = threading.Lock()
        self.prog: Progress | None = None
        # the threads' work queue: one chain, or the tiny chains together (they cost more in locking and Python
        # than in decoding: one thread goes through them while the others decode big chains in C)
        self._cond = threading.Condition()
        self._arrived: set[int] = set()
        self._waiting: dict[int, list[_Chain]] = {}
        self._ready: collections.deque[list[_Chain]] = collections.deque()
        self._todo = 0
        self._failed: list[BaseException] = []

    # ---------------------------------------------------------------- planning
    def plan(self, leaves: dict[str, Any]) -> None:
        first_of: dict[str, _Chain] = {}
        for name, lf in leaves.items():
            n = int(lf["nbytes"])
            if sum(int(c["len"]) for c in lf["chunks"]) != n:
                raise IntegrityError(
                    f"tensor {name!r} of checkpoint {self.doc['id']} has chunks that do not add up to {n} bytes"
                )
            self.datas[name] = heap_empty(n)
            off = 0
            for i, c in enumerate(lf["chunks"]):
                ln = int(c["len"])
                dst = self.datas[name][off : off + ln]
                off += ln
                same = first_of.get(c["raw"])
                if same is not None and same.entry["len"] == ln:
                    self.copies.append((same, dst))
                    continue
                ch = _Chain(name, i, c, walk_chunks(c)[::-1], dst)
                first_of[c["raw"]] = ch
                self.chains.append(ch)
        self.chains.sort(key=lambda ch: -int(ch.entry["len"]))  # big first: the threads finish together
        self._group_reads()

    def _group_reads(self) -> None:
        # a read brings at most pack_max bytes; from an object the store says is not cached (a local file, cold),
        # at most the store's read_bytes: each read is read ahead as a whole, so decoding starts sooner
        cold_max = min(self.pack_max, int(getattr(self.store, "read_bytes", 0) or self.pack_max))
        cached = getattr(self.store, "cached", None)
        frames_of: dict[str, dict[int, int]] = {}  # object -> frame offset -> size
        age: dict[str, int] = {}  # object -> how far from the end of a chain its oldest frame is
        for ch in self.chains:
            for k, e in enumerate(ch.chain):
                fr = frames_of.setdefault(e["obj"], {})
                fr[int(e["off"])] = int(e["size"])
                age[e["obj"]] = max(age.get(e["obj"], 0), len(ch.chain) - 1 - k)
        order = sorted(frames_of, key=lambda key: -age[key])  # stable: then by first use
        for key in order:
            read_max = (
                cold_max if cold_max < self.pack_max and cached and cached(key) is False else self.pack_max
            )
            lo = hi = -1
            members: list[int] = []
            for off, size in sorted(frames_of[key].items()):
                end = off + size
                if members and (end - lo > read_max or off - hi > _GAP_BYTES):
                    self.groups.append((key, lo, hi))
                    members = []
                if not members:
                    lo, hi = off, end
                members.append(off)
                hi = max(hi, end)
                self.group_of[(key, off)] = len(self.groups)
            if members:
                self.groups.append((key, lo, hi))
        # requested in the order the chains need them: a chain's base and delta come in together, so chains
        # are done one after another while the reads go on (from a cold cache, 5-10% sooner than all the
        # bases first)
        first = [len(self.chains)] * len(self.groups)
        for ci, ch in enumerate(self.chains):
            for e in ch.chain:
                gi = self.group_of[(e["obj"], int(e["off"]))]
                first[gi] = min(first[gi], ci)
        order_of = {g: i for i, g in enumerate(sorted(range(len(self.groups)), key=lambda g: (first[g], g)))}
        self.groups = [self.groups[g] for g in sorted(order_of, key=order_of.__getitem__)]
        self.group_of = {k: order_of[g] for k, g in self.group_of.items()}
        self.left = [0] * len(self.groups)
        for ch in self.chains:
            ch.groups = [self.group_of[(e["obj"], int(e["off"]))] for e in ch.chain]
            for gi in ch.groups:
                self.left[gi] += 1

    # ---------------------------------------------------------------- frames
    def _where(self, name: str, idx: int, e: Entry) -> str:
        what = self.labels.get(name) or f"tensor {name!r}"
        return f"{what} chunk {idx} (object {e['obj']}) of checkpoint {self.doc['id']}"

    def _fetch(self, name: str, idx: int, e: Entry, reread: bool = False) -> bytes | memoryview:
        key = e["obj"]
        gi = self.group_of[(key, int(e["off"]))]
        try:
            if reread:
                return self.store.get_range(key, e["off"], e["size"])
            blob = self.futures[gi].result()
        except ObjectMissingError:
            raise ObjectMissingError(key, f"needed by {self._where(name, idx, e)}") from None
        with self._left_lock:
            self.left[gi] -= 1
            if self.left[gi] <= 0:
                self.futures.pop(gi, None)  # the last frame of this read: let its bytes go
        o = int(e["off"]) - self.groups[gi][1]
        if o or len(blob) != e["size"]:
            return memoryview(blob)[o : o + int(e["size"])]  # no copy
        return blob

    def _corrupt_frame(
        self, name: str, idx: int, e: Entry, frame: bytes | memoryview
    ) -> IntegrityError | None:
        if len(frame) != e["size"] or self.hv(frame) != e["hash"]:
            return IntegrityError(
                f"corrupted data: stored bytes of {self._where(name, idx, e)} do not match their hash"
            )
        return None

    def _diagnose(self, name: str, idx: int, e: Entry, why: str = "") -> IntegrityError:
        """Find which frame of a chain that decoded to the wrong bytes (or not at all: ``why``) is at fault (slow
        path)."""
        for link in reversed(walk_chunks(e)):  # oldest base first
            frame = self._fetch(name, idx, link, reread=True)
            err = self._corrupt_frame(name, idx, link, frame)
            if err is not None:
                return err
        if why:  # every frame is what the writer stored, and one of them does not decode
            return IntegrityError(f"malformed frame: {self._where(name, idx, e)} does not decode ({why})")
        return IntegrityError(
            f"corrupted data: decoded bytes of {self._where(name, idx, e)} do not match their hash"
        )

    def _step(self, ch: _Chain) -> None:
        """Decode the next frame of a chain (its bytes have arrived) into the chain's memory."""
        e = ch.chain[ch.level]
        frame = self._fetch(ch.name, ch.idx, e)
        try:
            decode_chunk(frame, ch.dst if ch.level else None, ch.dst)
        except ValueError as err:
            raise self._corrupt_frame(ch.name, ch.idx, e, frame) or self._diagnose(
                ch.name, ch.idx, ch.entry, str(err)
            ) from err
        ch.level += 1
        if ch.level == len(ch.chain):
            # a delta's decoded bytes depend on every byte of its base: checking the end checks the chain
            if self.verify and not self._intact(ch):
                raise self._diagnose(ch.name, ch.idx, ch.entry)
            assert self.prog is not None
            self.prog.add(int(ch.entry["len"]))

    def _intact(self, ch: _Chain) -> bool:
        """Whether a decoded chunk holds the bytes that were saved: its XXH3-128 where the writer recorded one
        (and ``xxhash`` is here), else its hash (``raw``)."""
        want = ch.entry.get("xxh3")
        if want is not None and self.check is not None:
            return bool(self.check(ch.dst.data) == want)
        return bool(self.hv(ch.dst.data) == ch.entry["raw"])

    # ---------------------------------------------------------------- scheduling
    def _wait_for(self, ch: _Chain) -> bool:
        """With ``_cond`` held: True if the chain's next frame is here, else park it until it is."""
        gi = ch.groups[ch.level]
        if gi in self._arrived:
            return True
        self._waiting.setdefault(gi, []).append(ch)
        return False

    def _make_ready(self, chs: list[_Chain]) -> None:
        """With ``_cond`` held: queue chains whose next frame is here, the tiny ones together and first, then
        the big ones biggest first (so that the threads finish together)."""
        tiny = [ch for ch in chs if int(ch.entry["len"]) < _TINY_BYTES]
        if tiny:
            self._ready.append(tiny)
        self._ready.extend([ch] for ch in chs if int(ch.entry["len"]) >= _TINY_BYTES)
        self._cond.notify_all()

    def _on_arrival(self, gi: int) -> None:
        with self._cond:
            self._arrived.add(gi)
            self._make_ready(self._waiting.pop(gi, []))

    def _worker(self) -> None:
        cond = self._cond
        while True:
            with cond:
                while not self._ready and self._todo and not self._failed:
                    cond.wait()
                if self._failed or not self._todo:
                    return
                item = self._ready.popleft()
            try:
                for ch in item:
                    while True:
                        self._step(ch)
                        with cond:
                            if ch.level == len(ch.chain):
                                self._todo -= 1
                                if not self._todo:
                                    cond.notify_all()
                                break
                            if not self._wait_for(ch):
                                break
            except BaseException as err:  # noqa: BLE001 - handed to the caller by run()
                with cond:
                    self._failed.append(err)
                    cond.notify_all()
                return

    def _decode_all(self) -> None:
        """Decode on ``threads`` threads: the caller's and ``threads - 1`` of the decode pool (the Checkpointer's,
        idle during a restore: no thread is started for one)."""
        n_workers = max(1, min(self.threads, len(self.chains)))
        if n_workers == 1:
            self._worker()
            return
        own = self.pools is None
        pool = (
            cf.ThreadPoolExecutor(max_workers=n_workers - 1, thread_name_prefix="gnb-ckpt-restore")
            if self.pools is None
            else self.pools[0]
        )
        futs = [pool.submit(self._worker) for _ in range(n_workers - 1)]
        try:
            self._worker()
            for f in futs:
                f.result()
        except BaseException:  # e.g. KeyboardInterrupt: the workers stop at their next frame
            with self._cond:
                self._failed.append(CheckpointError("restore interrupted"))
                self._cond.notify_all()
            raise
        finally:
            cf.wait(futs)
            if own:
                pool.shutdown(wait=True)

    def run(self, prog: Progress) -> None:
        """Fetch and decode every chain into :attr:`datas`."""
        self.prog = prog
        io_threads = max(self.threads, int(getattr(self.store, "max_concurrency", 0)))
        own = self.pools is None
        fetch_pool = (
            cf.ThreadPoolExecutor(max_workers=io_threads, thread_name_prefix="gnb-ckpt-fetch")
            if self.pools is None
            else self.pools[1]
        )
        store = self.store
        self.futures = {
            i: fetch_pool.submit(store.get_range, key, lo, hi - lo)
            for i, (key, lo, hi) in enumerate(self.groups)
        }
        self._todo = len(self.chains)
        with self._cond:
            self._make_ready([ch for ch in self.chains if self._wait_for(ch)])
        for gi, fut in list(self.futures.items()):
            fut.add_done_callback(lambda _f, gi=gi: self._on_arrival(gi))  # type: ignore[misc]
        try:
            self._decode_all()
        finally:
            pending = list(self.futures.values())
            for f in pending:
                f.cancel()
            if own:
                fetch_pool.shutdown(wait=True, cancel_futures=True)
            else:
                cf.wait(pending)
        if self._failed:
            raise self._failed[0]
        for src, dst in self.copies:
            dst[:] = src.dst
            prog.add(dst.nbytes)
        prog.finish()
