"""The background half of a save: plan the chunks, encode and upload them on the I/O threads, commit the
manifest, and make the committed snapshot the base of the next delta. A failed attempt is retried.

Objects are written create-only under ``objects/<hash of stored bytes>``; the manifest is written last
(create-only). A save interrupted anywhere before that leaves no visible checkpoint.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._progress import Progress
from ..format.manifest import CheckpointInfo
from ..format.tree import GROUP_PREFIX, Leaf
from ..snapshot import BufferPool, Snapshot
from ..stores import Store
from .commit import Committer
from .encode import ChunkEncoder, Entry
from .lineage import Lineage
from .plan import chunks_of, pack_threshold, plan_save

__all__ = ["PersistOptions", "persist", "persist_with_retries"]

log = logging.getLogger("gpu_notebook.checkpoint")

# chunks under this many bytes (norm weights, biases, optimizer step counters: most of a model's tensors, little of
# its bytes) are encoded, and decoded, one after another by one task: per chunk they cost more in task and lock
# overhead than in work, and run on one thread while the others encode the big chunks in C
TINY_BYTES = 64 * 1024


@dataclass(frozen=True)
class PersistOptions:
    """The settings of a :class:`Checkpointer` one save runs with."""

    store: Store
    hash_fn: Callable[[Any], str]
    full_every: int
    max_restore_ratio: float | None
    chunk_bytes: int
    pack_bytes: int
    pack_max: int
    level: int
    threads: int
    progress: Any
    committer: Committer
    uploads: cf.ThreadPoolExecutor | None = None  # the upload pool (None: the encoding threads upload)


def _encode_all(enc: ChunkEncoder, pool: cf.ThreadPoolExecutor) -> dict[int, Entry]:
    """Every chunk's manifest entry, by position: the tiny chunks on one task, each big one on its own."""
    chunks = enc.plan.chunks
    tiny = [c for c in chunks if c.len < TINY_BYTES]
    batches = ([tiny] if tiny else []) + [[c] for c in chunks if c.len >= TINY_BYTES]
    futs = [pool.submit(enc.encode_all, b) for b in batches]
    results: list[tuple[int, Entry]] = []
    try:
        for f in futs:
            results.extend(f.result())
    except BaseException:
        for f in futs:
            f.cancel()
        cf.wait(futs)  # nothing of this save runs on once it has failed
        enc.wait_uploads(cancel=True)
        raise
    enc.flush()
    enc.wait_uploads()
    entries = dict(results)
    for k, e in list(entries.items()):
        if "$same" in e:
            entries[k] = entries[e["$same"]]
    return entries


def _chunk_docs(enc_leaves: list[Leaf], entries: dict[int, Entry], chunk_bytes: int) -> dict[str, Any]:
    """Per encoded leaf (a group leaf included), its chunk entries: ``{"chunks": [...]}``."""
    docs: dict[str, Any] = {}
    pos = 0
    for leaf in enc_leaves:
        n_chunks = len(chunks_of(leaf, chunk_bytes))
        docs[leaf.name] = {"chunks": [entries[pos + j] for j in range(n_chunks)]}
        pos += n_chunks
    return docs


def _shard_doc(snap: Snapshot, chunk_docs: dict[str, Any], rank: int) -> dict[str, Any]:
    """This rank's shard: per leaf its kind, dtype, shape, size and chunk entries, and the ``groups`` (small tensors
    saved together: per dtype its size, chunk entries and its members, columnar: their names and shapes in the
    order their bytes lie in the group) when there are any. A reader lists the members as leaves again
    (``validate.expand_groups``)."""
    leaves_doc: dict[str, Any] = {}
    groups: dict[str, Any] = {}
    for leaf in snap.leaves:
        if leaf.members is None:
            leaves_doc[leaf.name] = {
                "kind": leaf.kind,
                "dtype": leaf.dtype,
                "shape": leaf.shape,
                "nbytes": leaf.nbytes,
                # (a leaf another rank encodes: its entries come with that rank's record, see spread.py)
                "chunks": None if leaf.remote else chunk_docs[leaf.name]["chunks"],
            }
            continue
        groups[leaf.name[len(GROUP_PREFIX) :]] = {
            "dtype": leaf.dtype,
            "nbytes": leaf.nbytes,
            "chunks": chunk_docs[leaf.name]["chunks"],
            "names": [name for name, _ in leaf.members],
            "shapes": [shape for _, shape in leaf.members],
        }
    shard: dict[str, Any] = {"rank": rank, "tree": snap.tree, "leaves": leaves_doc}
    if groups:
        shard["groups"] = groups
    return shard


def persist(
    snap: Snapshot,
    ckpt_id: str,
    opts: PersistOptions,
    lineage: Lineage,
    buffers: BufferPool,
    pool: cf.ThreadPoolExecutor,
    seq: int,
    prefault: Callable[[Callable[[], None]], object],
) -> CheckpointInfo | None:
    """Write one snapshot as checkpoint ``ckpt_id``; its info (None on a rank that does not commit).

    ``seq`` counts the saves (it ages the encoding hints); ``prefault`` runs a task after this save's handle has
    resolved (on the save thread), used to fault in the next snapshot's buffers after the first save.
    """
    t_start = time.perf_counter()
    cpu_start = time.thread_time()
    spread = bool(getattr(snap, "spread", False))
    # (a spread save's kind was agreed by the ranks when it started: a base where any rank's part called for one)
    is_base = (
        snap.full if spread else lineage.next_is_base(snap.full, opts.full_every, opts.max_restore_ratio)
    )
    total = snap.nbytes
    prog = snap.progress or Progress(f"checkpoint {ckpt_id}", total, opts.progress)
    prog.restart()  # (a retry counts again from 0)
    # per chunk, in parallel: hash it; reuse an unchanged chunk (or one already claimed by another chunk of this
    # save: tied weights) as is; else encode it (against the same chunk of the lineage's base: the last full base,
    # or the previous checkpoint) and upload a big frame directly (small ones are collected into packs)
    # (small tensors travel in their group; a spread save's leaves of other ranks are theirs to encode)
    enc_leaves = [lf for lf in snap.leaves if not lf.remote]
    plan = plan_save(enc_leaves, lineage.shadow, opts.chunk_bytes, is_base, lineage.recent)
    expect = lineage.new_bytes.get(is_base) or lineage.new_bytes.get(
        not is_base
    )  # the first delta: the base's
    enc = ChunkEncoder(
        plan,
        store=opts.store,
        hash_fn=opts.hash_fn,
        level=opts.level,
        pack_bytes=opts.pack_bytes,
        pack_at=pack_threshold(expect, opts.pack_max, opts.threads),
        lineage=lineage,
        seq=seq,
        progress=prog,
        uploads=opts.uploads,
        threads=opts.threads,
    )
    chunk_docs = _chunk_docs(enc_leaves, _encode_all(enc, pool), opts.chunk_bytes)
    shard = _shard_doc(snap, chunk_docs, opts.committer.rank)
    n = enc.counters
    stats = {
        "raw_bytes": total,
        "new_bytes": n.new_bytes,
        "new_objects": n.new_objects,
        "reused_bytes": n.reused_bytes,
        "stall_s": round(snap.stall_s, 6),
        "persist_s": round(time.perf_counter() - t_start, 6),
        # CPU time of the save thread and the encoding threads (their scheduler counters) up to the commit: what
        # the background save takes from the training process's cores
        "cpu_s": round(n.cpu_s + time.thread_time() - cpu_start, 6),
    }
    info = opts.committer.commit(snap, ckpt_id, shard, stats, is_base, lineage.parent)
    lineage.rates[is_base] = total / max(1e-6, time.perf_counter() - t_start)
    lineage.new_bytes[is_base] = n.new_bytes
    lineage.last_raw = total
    prog.finish()
    # the committed snapshot becomes the base of the next delta; the old base's buffers are reused
    # (a spread save: what every rank wrote, as the manifest says, so that every rank's rollup rule decides alike)
    new = int(info.extra["stats"].get("new_bytes", n.new_bytes)) if spread and info else n.new_bytes
    old = lineage.committed(enc_leaves, chunk_docs, info.id if info else ckpt_id, is_base, new, spread)
    buffers.recycle(old)
    if not old:  # the first save: the next one has no buffers to recycle yet; fault them in next, on the save
        # thread but after this save's handle has resolved (its caller need not wait for them)
        prefault(lambda: buffers.prefault(enc_leaves))
    return info


def persist_with_retries(
    attempt_once: Callable[[], CheckpointInfo | None], ckpt_id: str, retries: int, backoff_s: float
) -> tuple[CheckpointInfo | None, BaseException | None]:
    """Run ``attempt_once`` up to ``retries + 1`` times with exponential backoff; (its info, None), or (None,
    the last error) when every attempt failed."""
    err: BaseException | None = None
    for attempt in range(retries + 1):
        try:
            return attempt_once(), None
        except Exception as e:  # noqa: BLE001 - any failure of an attempt is retried, then reported by the caller
            err = e
            if attempt < retries and getattr(
                e, "retryable", True
            ):  # (a commit deadline ends the save at once)
                delay = backoff_s * 2**attempt
                log.warning(
                    "checkpoint %s: save attempt %d failed (%s); retrying in %.1f s",
                    ckpt_id,
                    attempt + 1,
                    e,
                    delay,
                )
                time.sleep(delay)
    return None, err
