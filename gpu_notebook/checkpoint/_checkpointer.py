"""The :class:`Checkpointer`: snapshot on the training thread, encode and upload in the background.

Save pipeline (one save in flight at most):

1. ``save()`` flattens the state into a JSON tree and tensor leaves, copying every tensor to host memory
   (the only work on the training thread), and hands the snapshot to a background thread.
2. The background thread splits leaves into chunks, hashes them (BLAKE3 of the raw bytes), reuses every
   chunk whose bytes are already in the store, and encodes the others as lossless deltas against the last
   committed snapshot (or in full for a base checkpoint); small frames are packed into one object.
3. Objects are written create-only under ``objects/<BLAKE3 of stored bytes>``; the manifest is written last
   (create-only). A save interrupted anywhere before that leaves no visible checkpoint.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import functools
import hashlib
import json
import logging
import os
import platform
import sys
import threading
import time
import uuid
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from ._errors import (
    CheckpointError,
    CheckpointSaveError,
    FormatVersionError,
    IntegrityError,
    NoCheckpointError,
    ObjectMissingError,
    ShapeMismatchError,
    StoreError,
)
from ._manifest import (
    FORMAT_NAME,
    FORMAT_VERSION,
    MANIFEST_PREFIX,
    OBJECT_PREFIX,
    SHARD_PREFIX,
    CheckpointInfo,
    CheckpointList,
    _fmt_bytes,
    blake3_available,
    check_version,
    doc_hash,
    hash_fn,
    id_from_key,
    manifest_key,
    manifest_objects,
    read_manifest,
    restore_frames,
    walk_chunks,
)
from ._progress import Progress
from ._store import Store, open_store
from ._tree import Leaf, flatten, leaf_from_bytes, unflatten

__all__ = ["Checkpointer", "SaveHandle", "current", "GcResult", "DiffResult"]

log = logging.getLogger("gpu_notebook.checkpoint")

_current: weakref.ref[Checkpointer] | None = None


#: an encoding choice is reused for this many saves, then searched afresh
_HINT_SAVES = 8
#: restore reads frames of one object separated by at most this many unneeded bytes with one ranged GET (a
#: request costs a round trip, about what a few MB take to arrive)
_GAP_BYTES = 4 << 20
# chunks under this many bytes (norm weights, biases, optimizer step counters: most of a model's tensors, little of
# its bytes) are encoded, and decoded, one after another by one task: per chunk they cost more in task and lock
# overhead than in work, and run on one thread while the others encode the big chunks in C
_TINY_BYTES = 64 * 1024
# a pack is closed (and uploaded, while the encoding goes on) once it holds 1 / (_PACKS_PER_THREAD * threads) of
# what the previous save of the same kind wrote, so that the last pack, uploaded after the encoding, is small; at
# least _PACK_MIN bytes (every object is a request to write and one to read: S3 charges per request, and each
# costs a round trip; 4 MiB instead of 1 made a 20 MB bf16 restore from the test S3 server 15 % faster), at most
# pack_max
_PACKS_PER_THREAD = 2
_PACK_MIN = 4 << 20


def current() -> Checkpointer | None:
    """The most recently created (or used) :class:`Checkpointer` in this process, or None."""
    return _current() if _current is not None else None


def _set_current(c: Checkpointer) -> None:
    global _current
    _current = weakref.ref(c)


def _obj_key(h: str) -> str:
    return f"{OBJECT_PREFIX}{h[:2]}/{h}"


def _rank_world(rank: int | None, world_size: int | None) -> tuple[int, int, bool]:
    """Rank and world size: explicit, else torch.distributed (if initialised), else env, else 0/1."""
    dist_ok = False
    if "torch" in sys.modules:
        try:
            import torch.distributed as dist

            dist_ok = dist.is_available() and dist.is_initialized()
        except Exception:  # pragma: no cover
            dist_ok = False
    if rank is None:
        if dist_ok:
            import torch.distributed as dist

            rank = dist.get_rank()
        else:
            rank = int(os.environ.get("RANK", "0"))
    if world_size is None:
        if dist_ok:
            import torch.distributed as dist

            world_size = dist.get_world_size()
        else:
            world_size = int(os.environ.get("WORLD_SIZE", "1"))
    return int(rank), int(world_size), dist_ok


class SaveHandle:
    """The result of :meth:`Checkpointer.save`: a future for one background save."""

    def __init__(self, ckpt_id: str | None, step: int, future: cf.Future[Any] | None, skipped: bool = False):
        self.id = ckpt_id
        self.step = step
        self.skipped = skipped
        self._future = future

    def done(self) -> bool:
        return self._future is None or self._future.done()

    def result(self, timeout: float | None = None) -> CheckpointInfo | None:
        """Wait for the save; return its :class:`CheckpointInfo` (None if skipped or not written by this rank)."""
        if self._future is None:
            return None
        return self._future.result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        return None if self._future is None else self._future.exception(timeout)

    def __repr__(self) -> str:
        state = "skipped" if self.skipped else ("done" if self.done() else "saving")
        return f"<SaveHandle {self.id} step={self.step} {state}>"


class GcResult(dict):  # type: ignore[type-arg]
    """What :meth:`Checkpointer.gc` removed: ``manifests``, ``objects``, ``bytes``, ``kept``."""

    def __repr__(self) -> str:
        return (
            f"gc: kept {len(self['kept'])} checkpoint(s), deleted {len(self['manifests'])} checkpoint(s) and "
            f"{len(self['objects'])} object(s), freed {self['bytes'] / 1e6:.1f} MB"
        )


class DiffResult(dict):  # type: ignore[type-arg]
    """What differs between two checkpoints (see :meth:`Checkpointer.diff`)."""

    def __repr__(self) -> str:
        lines = [f"diff {self['a']} -> {self['b']}:"]
        lines.append(
            f"  tensors: {len(self['changed'])} changed, {len(self['unchanged'])} unchanged, "
            f"{len(self['added'])} added, {len(self['removed'])} removed"
        )
        for name, info in list(self["changed"].items())[:30]:
            lines.append(f"  ~ {name}: {info['chunks_changed']}/{info['chunks']} chunk(s) changed")
        for name in self["added"][:10]:
            lines.append(f"  + {name}")
        for name in self["removed"][:10]:
            lines.append(f"  - {name}")
        for path, (va, vb) in list(self["values"].items())[:30]:
            lines.append(f"  {path}: {va!r} -> {vb!r}")
        return "\n".join(lines)


class _Snapshot:
    """A flattened, host-memory copy of the state at one step."""

    def __init__(self, tree: Any, leaves: list[Leaf], step: int, stall_s: float):
        self.tree = tree
        self.leaves = leaves
        self.step = step
        self.stall_s = stall_s
        self.created_at = time.time()
        self.full = False  # write a full base whatever the schedule says
        self.progress: Progress | None = None  # shown by save() on its own thread: in the cell that saved

    @property
    def nbytes(self) -> int:
        return sum(lf.nbytes for lf in self.leaves)


class _Chain:
    """One chunk to restore: its frames (a full one, then the deltas on it), decoded in turn into ``dst``."""

    __slots__ = ("name", "idx", "entry", "chain", "dst", "level", "groups")

    def __init__(
        self, name: str, idx: int, entry: dict[str, Any], chain: list[dict[str, Any]], dst: np.ndarray
    ):
        self.name = name
        self.idx = idx
        self.entry = entry  # the end of the chain (what the manifest lists)
        self.chain = chain  # oldest first
        self.dst = dst
        self.level = 0  # the next frame to decode
        self.groups: list[int] = []  # the read that brings each frame


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
    try:
        from importlib.metadata import version

        info["version"] = version("gpu_notebook")
    except Exception:  # noqa: BLE001
        pass
    return info


class Checkpointer:
    """Lossless delta checkpoints of training state into a local folder or S3.

    Parameters
    ----------
    store
        A folder path (``file://`` optional), ``s3://bucket/prefix``, or a :class:`Store`.
    full_every
        Every ``full_every``-th checkpoint is a full base, so delta chains stay at most that long.
    max_restore_ratio
        Also write a full base as soon as restoring the next delta would read more than this many times the
        bytes of a full checkpoint (the delta chains' frames add up; a restore reads and decodes all of them).
        This bounds restore time where deltas save little (full fp32 training: a base about every 4-5 saves at
        3.0) and leaves long chains where they save much (fine-tuning). None: only ``full_every`` decides.
    chunk_mb
        Raw chunk size in MiB (tensors are split into element-aligned chunks of this size).
    pack_kb, pack_max_mb
        Encoded frames smaller than ``pack_kb`` are packed together into objects of up to ``pack_max_mb``
        (fewer, bigger objects: fewer requests, which S3 charges for and which cost a round trip each); a pack
        is closed and uploaded earlier, while the encoding goes on, once it holds 1 / (2 x threads) of what
        the previous save of the same kind wrote (at least 4 MiB). Restore reads them with ranged GETs of at
        most ``pack_max_mb``.
    level
        zstd level (1 is fast; 3 compresses a little better).
    on_busy
        What ``save()`` does while the previous save is still uploading: ``"wait"`` or ``"skip"``.
    every_steps, every_minutes
        Policy for :meth:`maybe_save` (either or both; the default suggestion for spot instances is 15 min).
    retries, retry_backoff_s
        A failed background save is retried this many times, with exponential backoff.
    threads
        Threads that encode and upload chunks in parallel.
    sharded
        In a multi-rank job: every rank saves its own shard (True), or the state is replicated and only
        rank 0 writes (False, the default, right for DDP).
    rank, world_size
        Override the rank/world size (default: torch.distributed, else ``RANK``/``WORLD_SIZE``).
    allow_pickle
        Pickle values without a safe representation (restore then also needs ``allow_pickle=True``).
    progress
        None (auto: a progress line in notebooks for big transfers), False, True, or a callable
        ``(label, done_bytes, total_bytes, elapsed_s)``.
    commit_timeout_s
        How long rank 0 waits for the other ranks' shards of a sharded save.
    preemption
        ``"auto"``: on a cloud VM, watch the metadata service for a spot preemption notice (see
        :class:`PreemptionWatcher`); a :class:`PreemptionWatcher` to use; None: do not watch.
    on_preemption
        What :meth:`maybe_save` writes on a notice: ``"auto"`` (a full base if it fits in half the time left,
        else a delta), ``"full"`` or ``"delta"``.
    hash
        ``"blake3"`` (format version 3, the default when the package is installed) or ``"sha256"`` (version 2).
    read_only
        Only read the store (list, show, diff, restore): nothing is written, not even the store's ``FORMAT``
        marker, a missing store is an error instead of being created, and :meth:`save` and :meth:`gc` refuse.
        Works with read-only credentials.
    current
        Make this the current checkpointer (the store ``%gpu_checkpoint`` uses by default).
    store_options
        Passed to :class:`S3Store` for ``s3://`` URLs (``endpoint_url``, ``region_name``, ...).

    Examples
    --------
    >>> ckpt = Checkpointer("/tmp/run1", every_steps=100)          # doctest: +SKIP
    >>> ckpt.maybe_save({"model": model, "optim": opt, "step": step}, step)  # doctest: +SKIP
    >>> state = ckpt.restore(into={"model": model, "optim": opt})  # doctest: +SKIP
    """

    def __init__(
        self,
        store: str | os.PathLike[str] | Store,
        *,
        full_every: int = 10,
        max_restore_ratio: float | None = 3.0,
        chunk_mb: float = 4.0,
        pack_kb: int = 8192,
        pack_max_mb: float = 16.0,
        level: int = 1,
        on_busy: str = "wait",
        every_steps: int | None = None,
        every_minutes: float | None = None,
        retries: int = 3,
        retry_backoff_s: float = 1.0,
        threads: int | None = None,
        sharded: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        allow_pickle: bool = False,
        progress: bool | Callable[[str, int, int, float], None] | None = None,
        commit_timeout_s: float = 600.0,
        preemption: Any = "auto",
        on_preemption: str = "auto",
        hash: str | None = None,
        read_only: bool = False,
        current: bool = True,
        **store_options: Any,
    ) -> None:
        if on_busy not in ("wait", "skip"):
            raise ValueError("on_busy must be 'wait' or 'skip'")
        if on_preemption not in ("auto", "full", "delta"):
            raise ValueError("on_preemption must be 'auto', 'full' or 'delta'")
        if full_every < 1:
            raise ValueError("full_every must be >= 1")
        if max_restore_ratio is not None and max_restore_ratio < 1:
            raise ValueError("max_restore_ratio must be >= 1 (or None)")
        # format version 3 hashes with BLAKE3; without the blake3 package this writes version 2 (SHA-256)
        self.hash = hash or ("blake3" if blake3_available() else "sha256")
        self._h = hash_fn(self.hash)
        self._version = FORMAT_VERSION if self.hash == "blake3" else 2
        self.store: Store = open_store(store, **store_options)
        self.read_only = bool(read_only)
        self.full_every = int(full_every)
        self.max_restore_ratio = None if max_restore_ratio is None else float(max_restore_ratio)
        self.chunk_bytes = max(8, int(chunk_mb * 2**20) // 8 * 8)
        self.pack_bytes = int(pack_kb * 1024)
        self.pack_max = int(pack_max_mb * 2**20)
        self.level = int(level)
        self.on_busy = on_busy
        self.every_steps = every_steps
        self.every_minutes = every_minutes
        self.retries = int(retries)
        self.retry_backoff_s = float(retry_backoff_s)
        self.threads = threads or max(2, min(8, os.cpu_count() or 2))
        self.allow_pickle = allow_pickle
        self.progress = progress
        self.commit_timeout_s = commit_timeout_s
        self.rank, self.world_size, dist_ok = _rank_world(rank, world_size)
        self.sharded = bool(sharded) and self.world_size > 1
        self._token = self._session_token(dist_ok)
        self._seq = 0
        self._auto_step: int | None = None  # the next step of a save given none (after the store's newest)
        self._lock = threading.Lock()
        self._executor = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="gnb-ckpt-save")
        self._pool = cf.ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="gnb-ckpt-io")
        self._inflight: SaveHandle | None = None
        self._errors: list[BaseException] = []
        self.failures: list[tuple[str | None, str]] = []  # (id, message) of every save that failed for good
        # delta state: the last committed snapshot of *this rank*
        self._shadow: dict[str, dict[str, Any]] = {}
        self._free: dict[int, list[np.ndarray]] = {}  # recycled snapshot buffers, by size
        self._free_pinned: dict[int, list[np.ndarray]] = {}  # ... page-locked ones (copies from GPUs)
        self._pinned: weakref.WeakValueDictionary[int, np.ndarray] = weakref.WeakValueDictionary()
        self._parent: str | None = None
        self._since_base = 0
        self._last_save_step: int | None = None
        self._last_save_time: float | None = None
        self._created = time.time()  # the every_minutes clock starts here
        # spot preemption: a watcher of the metadata service; maybe_save() saves at once on a notice
        self.on_preemption = on_preemption
        self._watcher: Any = None
        self._preempt_notice: Any = None
        self._preempt_saved = False
        self._ranks_watch: bool | None = None  # multi-rank: does any rank watch for notices (agreed once)
        self._rates: dict[bool, float] = {}  # raw bytes/s of the last full (True) and delta (False) persist
        self._new_bytes: dict[bool, int] = {}  # bytes written by the last full (True) and delta (False) save
        self._last_raw = 0
        if preemption is not None and preemption is not False and not self.read_only:
            from ._preemption import PreemptionWatcher

            self._watcher = (
                preemption
                if isinstance(preemption, PreemptionWatcher)
                else PreemptionWatcher(str(preemption))
            )
        self._info_cache: dict[str, CheckpointInfo] = {}
        self._hints: dict[
            tuple[str, int, str, bool], tuple[Any, int]
        ] = {}  # chunk kind -> (encoding choice, seq)
        self.last_info: CheckpointInfo | None = None
        self._open_store()
        if current:
            _set_current(self)

    # ------------------------------------------------------------------ setup
    def _session_token(self, dist_ok: bool) -> str:
        tok = uuid.uuid4().hex[:8]
        if self.world_size > 1 and dist_ok:
            import torch.distributed as dist

            box = [tok]
            dist.broadcast_object_list(box, src=0)
            tok = box[0]
        elif self.world_size > 1:
            seed = f"{os.environ.get('MASTER_ADDR', '')}:{os.environ.get('MASTER_PORT', '')}:{os.environ.get('TORCHELASTIC_RUN_ID', '')}"
            tok = hashlib.sha256(seed.encode()).hexdigest()[:8]
        return tok

    def _open_store(self) -> None:
        if self.read_only:
            self.store.check(write=False)
        else:
            self.store.check()
        doc = {"format": FORMAT_NAME, "version": self._version}
        # rank 0 writes the marker (create-only: a no-op when it exists): a store that cannot be written to
        # fails here, before training starts, and not in the first background save
        if not self.read_only and (self.rank == 0 or not self.store.exists("FORMAT")):
            self.store.put("FORMAT", json.dumps(doc).encode(), create_only=True)
        try:
            existing = json.loads(self.store.get("FORMAT"))
        except ObjectMissingError:
            if self.read_only:
                raise StoreError(
                    f"{self.store.url} is not a checkpoint store (it has no FORMAT marker): check the path"
                ) from None
            return  # pragma: no cover - raced with another rank
        except ValueError as e:
            raise StoreError(f"{self.store.url}/FORMAT is not valid JSON: {e}") from e
        check_version(existing, f"store {self.store.url}")

    def __repr__(self) -> str:
        last = f" last={self.last_info.id}" if self.last_info else ""
        ranks = f" rank={self.rank}/{self.world_size}" if self.world_size > 1 else ""
        return f"<Checkpointer {self.store.url}{ranks}{last}>"

    def _repr_html_(self) -> str:
        import html

        return f"<b>Checkpointer</b> {html.escape(repr(self))}"

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self, wait: bool = True) -> None:
        """Wait for the save in flight (if ``wait``) and stop the background threads."""
        if self._watcher is not None:
            self._watcher.stop()
        if wait:
            try:
                self.wait()
            finally:
                self._executor.shutdown(wait=True)
                self._pool.shutdown(wait=True)
        else:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._pool.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ save
    def _raise_pending(self) -> None:
        with self._lock:
            errs, self._errors = self._errors, []
        if errs:
            raise CheckpointSaveError(f"background checkpoint save failed: {errs[-1]}") from errs[-1]

    def save(
        self, state: Any, step: int | None = None, *, block: bool = False, full: bool | None = None
    ) -> SaveHandle:
        """Snapshot ``state`` now and write it in the background.

        Parameters
        ----------
        state
            Usually a dict such as ``{"model": model, "optim": optimizer, "step": step}``.
        step
            Training step; defaults to ``state["step"]`` if it is an int, else one after the newest step in the
            store (then counting up), so that a resumed run's checkpoints come after the ones it resumed from.
        block
            Wait until the checkpoint is committed.
        full
            True: write a full base now (no delta), whatever ``full_every`` says; None: as ``full_every`` says.

        Returns
        -------
        SaveHandle
            ``.result()`` waits and gives the :class:`CheckpointInfo`.

        Raises
        ------
        CheckpointSaveError
            An earlier background save failed for good (raised once, here or from :meth:`wait`).
        """
        self._check_writable("save")
        _set_current(self)
        self._raise_pending()
        if step is None:
            s = state.get("step") if isinstance(state, dict) else None
            step = int(s) if isinstance(s, int | np.integer) else self._next_auto_step()
        step = int(step)
        if self._auto_step is not None:
            self._auto_step = max(self._auto_step, step + 1)
        if step < 0:
            raise ValueError("step must be >= 0")
        if self.world_size > 1 and not self.sharded and self.rank != 0:
            # replicated state: rank 0 writes it; other ranks only keep the policy clock in step
            self._last_save_step, self._last_save_time = step, time.time()
            return SaveHandle(None, step, None)
        prev = self._inflight
        busy = prev is not None and not prev.done()
        if self.sharded and self.on_busy == "skip":
            # every rank skips, or none does: a shard missing from a checkpoint would stall its commit
            agreed = self._agree_min(0 if busy else 1)
            busy = busy if agreed is None else agreed == 0
        if busy:
            if self.on_busy == "skip":
                log.warning("checkpoint at step %s skipped: the previous save is still uploading", step)
                return SaveHandle(None, step, None, skipped=True)
            if prev is not None:
                try:
                    prev._future.result()  # type: ignore[union-attr]
                except Exception:
                    pass  # recorded by the job itself
            self._raise_pending()
        seq = self._seq
        if self.sharded:  # the ranks' shards meet under one id: agree on its counter (it could drift apart)
            agreed = self._agree_min(-seq)
            seq = seq if agreed is None else -agreed
        t0 = time.perf_counter()
        tree, leaves = flatten(state, allow_pickle=self.allow_pickle, copy=True, alloc=self._alloc)
        snap = _Snapshot(tree, leaves, step, time.perf_counter() - t0)
        snap.full = bool(full)
        ckpt_id = f"{step:012d}-{self._token}{seq:04d}"
        # the progress line is shown here, on the caller's thread (in a notebook: under the cell that saved),
        # and updated in place from the background; shown first from there, it could land under another cell
        snap.progress = Progress(f"checkpoint {ckpt_id}", snap.nbytes, self.progress)
        self._seq = seq + 1
        self._last_save_step, self._last_save_time = step, time.time()
        fut = self._executor.submit(self._persist_with_retries, snap, ckpt_id)
        handle = SaveHandle(ckpt_id, step, fut)
        self._inflight = handle
        if block:
            self.wait()
        return handle

    def _check_writable(self, what: str) -> None:
        if self.read_only:
            raise CheckpointError(
                f"cannot {what}: this Checkpointer of {self.store.url} was opened read_only=True"
            )

    def _next_auto_step(self) -> int:
        """The step of a save given none: one after the newest step in the store (so that a run resumed in a new
        process goes on after its checkpoints instead of starting again at 0 below them), then counting up."""
        if self._auto_step is None:
            top = -1
            for o in self.store.list(MANIFEST_PREFIX):
                cid = id_from_key(o.key)
                head = cid.split("-", 1)[0] if cid else ""
                if head.isdigit():
                    top = max(top, int(head))
            self._auto_step = top + 1
        step = self._auto_step
        if self.sharded:  # every rank must save under the same step
            agreed = self._agree_min(-step)
            step = step if agreed is None else -agreed
        return step

    def _alloc(self, nbytes: int, pinned: bool = False) -> np.ndarray:
        """A host buffer for a snapshot copy: a recycled one of that size, else a new one. ``pinned``: page-locked
        (for asynchronous copies from a GPU; falls back to ordinary memory where that is unavailable)."""
        lst = (self._free_pinned if pinned else self._free).get(nbytes)
        if lst:
            return lst.pop()
        if pinned:
            try:
                import torch

                if torch.cuda.is_available():
                    a = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True).numpy()
                    self._pinned[id(a)] = a
                    return a
            except Exception:  # noqa: BLE001 - out of page-locked memory, no driver: use pageable memory
                pass
        return np.empty(nbytes, dtype=np.uint8)

    def _prefault(self, leaves: list[Leaf]) -> None:
        """Ordinary host buffers for the next snapshot, their pages touched (a fresh allocation page-faults on
        first write, which would otherwise lengthen the next save's training stall)."""
        for leaf in leaves:
            d = leaf.data
            if (
                not isinstance(d, np.ndarray)
                or not d.nbytes
                or self._pinned.get(id(d)) is d
                or d.base is not None
            ):
                continue
            buf = np.empty(d.nbytes, dtype=np.uint8)
            buf.fill(0)
            self._free.setdefault(d.nbytes, []).append(buf)

    def _recycle(self, shadow: dict[str, dict[str, Any]]) -> None:
        free: dict[int, list[np.ndarray]] = {}
        free_pinned: dict[int, list[np.ndarray]] = {}
        seen: set[int] = set()
        for sh in shadow.values():
            d = sh["data"]
            if sh.get("check") or not isinstance(d, np.ndarray) or not d.nbytes or id(d) in seen:
                continue  # (restored buffers are the caller's tensors: never reused)
            seen.add(id(d))
            if self._pinned.get(id(d)) is d:
                free_pinned.setdefault(d.nbytes, []).append(d)
            elif d.base is None:
                free.setdefault(d.nbytes, []).append(d)
        self._free = free
        self._free_pinned = free_pinned

    def maybe_save(self, state: Any, step: int, *, force: bool = False) -> SaveHandle | None:
        """Save if the policy (``every_steps`` / ``every_minutes``) says it is time; else return None.

        On a spot preemption notice (see ``preemption``) it saves at once, whatever the policy, and waits until
        the checkpoint is committed: a full base when the measured save speed says one fits in half the time
        left (the checkpoint a resume restores is then a single base), else a delta. After that it saves no
        more; :attr:`preempted` tells the training loop to stop. In a multi-rank job every rank must call it at
        the same steps (a notice on any node is agreed on with one small all-reduce per call).
        """
        notice = self._agreed_notice()
        if notice is not None:
            if self._preempt_saved:
                return None
            full = self._preemption_full(notice)
            t0 = time.perf_counter()
            # the save in flight is waited for whatever on_busy says: this save must not be skipped
            self._wait_inflight()
            handle = self.save(state, step, full=full, block=True)
            self._preempt_saved = (
                True  # (not before: a save that raised saved nothing, the next call tries again)
            )
            log.warning(
                "preemption notice (%s): saved a %s checkpoint at step %s in %.1f s",
                notice,
                "full" if full else "delta",
                step,
                time.perf_counter() - t0,
            )
            return handle
        due = force or self._due(step)
        if self.world_size > 1 and self.every_minutes is not None and not force:
            # a clock decides: the ranks could disagree by a hair; any rank due makes every rank save
            agreed = self._agree_min(0 if due else 1)
            due = due if agreed is None else agreed == 0
        if due:
            return self.save(state, step)
        return None

    @property
    def preempted(self) -> Any:
        """The :class:`PreemptionNotice` once this machine (or, in a job, any rank's) got one, else None."""
        return self._preempt_notice

    def _preemption_full(self, notice: Any) -> bool:
        if self.on_preemption != "auto":
            return self.on_preemption == "full"
        left = notice.seconds_left()
        rate = self._rates.get(True)
        if rate and self._last_raw:
            return self._last_raw / rate <= 0.5 * left
        return left >= 60.0  # no full save measured yet: AWS's two minutes, not GCP's or Azure's 30 s

    def _agree_min(self, value: int) -> int | None:
        """The smallest ``value`` over the ranks of the process group (a collective: every rank must call it),
        or None when there is no process group."""
        try:
            import torch.distributed as dist

            if not (dist.is_available() and dist.is_initialized()):
                return None
            import torch

            dev = torch.device("cpu")
            if dist.get_backend() == "nccl":
                dev = torch.device("cuda", torch.cuda.current_device())
            t = torch.tensor([int(value)], dtype=torch.int64, device=dev)
            dist.all_reduce(t, op=dist.ReduceOp.MIN)
            return int(t.item())
        except ImportError:
            return None

    def _agreed_notice(self) -> Any:
        """This process's notice; in a multi-rank job, any rank's (every rank then saves together)."""
        w = self._watcher
        watching = w is not None and w.cloud is not None
        if self.world_size > 1 and self._ranks_watch is None:
            # once: whether any rank watches. Ranks can differ (a node whose cloud was not recognised, or
            # preemption=None on one): every rank must then take part in the agreement below, or the ranks
            # that watch would wait in an all-reduce the others never join
            try:
                agreed = self._agree_min(0 if watching else 1)
            except Exception as e:  # noqa: BLE001 - no working process group after all: decide locally
                log.debug("preemption agreement skipped: %s", e)
                agreed = None
            self._ranks_watch = watching if agreed is None else agreed == 0
        if not (watching or (self.world_size > 1 and self._ranks_watch)):
            return self._preempt_notice
        local = w.notice if watching else None  # type: ignore[union-attr]
        if self.world_size > 1 and self._ranks_watch:
            try:
                # 0 on every rank as soon as one rank has a notice
                if self._agree_min(0 if local is not None else 1) == 0 and local is None:
                    from ._preemption import DEFAULT_WARNING_S, PreemptionNotice

                    cloud = w.cloud if watching else "unknown"  # type: ignore[union-attr]
                    now = time.time()
                    local = PreemptionNotice(cloud, "peer", now + DEFAULT_WARNING_S.get(cloud, 30.0), now)
            except Exception as e:  # noqa: BLE001 - no working process group after all: decide locally
                log.debug("preemption agreement skipped: %s", e)
        if local is not None and self._preempt_notice is None:
            self._preempt_notice = local
        return self._preempt_notice

    def _due(self, step: int) -> bool:
        if self.every_steps is None and self.every_minutes is None:
            return True
        if self.every_steps is not None:
            if self._last_save_step is None or step - self._last_save_step >= self.every_steps:
                return True
        if self.every_minutes is not None:
            ref = self._last_save_time if self._last_save_time is not None else self._created
            if time.time() - ref >= 60.0 * self.every_minutes:
                return True
        return False

    def _wait_inflight(self) -> None:
        """Wait for the save in flight to end (its failure is recorded by the job and raised by the next save)."""
        h = self._inflight
        if h is not None and h._future is not None:
            try:
                h._future.result()
            except Exception:  # noqa: BLE001
                pass

    def wait(self, timeout: float | None = None) -> CheckpointInfo | None:
        """Wait for the save in flight; raise :class:`CheckpointSaveError` if a save failed for good."""
        h = self._inflight
        if h is not None and h._future is not None:
            try:
                h._future.result(timeout)
            except cf.TimeoutError:
                raise
            except Exception:
                pass
        self._raise_pending()
        return self.last_info

    def _persist_with_retries(self, snap: _Snapshot, ckpt_id: str) -> CheckpointInfo | None:
        err: BaseException | None = None
        for attempt in range(self.retries + 1):
            try:
                return self._persist(snap, ckpt_id)
            except Exception as e:  # noqa: BLE001
                err = e
                if attempt < self.retries:
                    delay = self.retry_backoff_s * 2**attempt
                    log.warning(
                        "checkpoint %s: save attempt %d failed (%s); retrying in %.1f s",
                        ckpt_id,
                        attempt + 1,
                        e,
                        delay,
                    )
                    time.sleep(delay)
        assert err is not None
        msg = (
            f"checkpoint {ckpt_id} (step {snap.step}) was NOT saved after {self.retries + 1} attempts: {err}"
        )
        log.error(msg)
        warnings.warn(msg, RuntimeWarning, stacklevel=1)
        with self._lock:
            self._errors.append(err)
            self.failures.append((ckpt_id, msg))
        raise CheckpointSaveError(msg) from err

    def _restore_too_costly(self) -> bool:
        """Would restoring the next delta read more than ``max_restore_ratio`` times a full checkpoint's bytes?
        The last checkpoint's chains (every frame down to their bases) plus what the last delta added, against
        their base frames (what a full checkpoint of the same state about costs)."""
        if self.max_restore_ratio is None:
            return False
        chunks = [c for sh in self._shadow.values() for c in sh["chunks"]]
        chains = sum(restore_frames(chunks).values())
        full = sum(walk_chunks(c)[-1]["size"] for c in chunks)
        return full > 0 and chains + self._new_bytes.get(False, 0) > self.max_restore_ratio * full

    def _chunks_of(self, leaf: Leaf) -> list[tuple[int, int]]:
        n = leaf.nbytes
        w = max(1, leaf.width)
        size = max(w, (self.chunk_bytes // w) * w)
        return [(o, min(size, n - o)) for o in range(0, n, size)]

    def _persist(self, snap: _Snapshot, ckpt_id: str) -> CheckpointInfo | None:
        t_start = time.perf_counter()
        is_base = (
            snap.full
            or not self._shadow
            or self._since_base + 1 >= self.full_every
            or self._restore_too_costly()
        )
        total = snap.nbytes
        prog = snap.progress or Progress(f"checkpoint {ckpt_id}", total, self.progress)
        prog.restart()  # (a retry counts again from 0)
        # 1) per chunk, in parallel: hash it; reuse an unchanged chunk (or one already claimed by another chunk
        # of this save: tied weights) as is; else encode it (against the same chunk of the previous checkpoint)
        # and upload a big frame directly (small ones are collected into packs)
        work: list[tuple[Leaf, int, int, int]] = []  # leaf, chunk index, offset, length
        for leaf in snap.leaves:
            for i, (o, ln) in enumerate(self._chunks_of(leaf)):
                work.append((leaf, i, o, ln))
        known: dict[str, dict[str, Any]] = {}
        for prev in self._shadow.values():
            for e in prev["chunks"]:
                if not is_base or e.get("depth", 0) == 0:
                    known.setdefault(e["raw"], e)
        plan: list[tuple[int, np.ndarray | None, dict[str, Any] | None, bool]] = []
        for k, (leaf, i, o, ln) in enumerate(work):
            base_arr: np.ndarray | None = None
            base_entry: dict[str, Any] | None = None
            check = False
            sh = self._shadow.get(leaf.name)
            if (
                not is_base
                and sh is not None
                and sh["dtype"] == leaf.dtype
                and sh["nbytes"] == leaf.nbytes
                and i < len(sh["chunks"])
            ):
                base_entry = sh["chunks"][i]
                base_arr = sh["data"][o : o + ln]
                check = bool(sh.get("check"))
            plan.append((k, base_arr, base_entry, check))
        plan.sort(key=lambda p: -work[p[0]][3])  # big chunks first, so that the threads finish together
        claimed: dict[str, int] = {}  # raw hash -> the chunk of this save that encodes it
        new_bytes = 0
        new_objects = 0
        reused_bytes = 0
        nb_lock = threading.Lock()

        # frames smaller than pack_bytes go into packs of up to pack_max bytes, uploaded as soon as they fill
        # (by the thread that filled it, while the others go on encoding): few, big objects, few requests
        pack: list[tuple[dict[str, Any], bytes]] = []
        pack_n = 0
        pack_lock = threading.Lock()
        expect = self._new_bytes.get(is_base) or self._new_bytes.get(
            not is_base
        )  # the first delta: the base's
        pack_at = self.pack_max
        if expect:
            pack_at = min(self.pack_max, max(_PACK_MIN, expect // (_PACKS_PER_THREAD * self.threads)))

        def upload_pack(items: list[tuple[dict[str, Any], bytes]]) -> None:
            nonlocal new_bytes, new_objects
            blob = b"".join(f for _, f in items)
            key = _obj_key(self._h(blob))
            off = 0
            for e, f in items:
                e.update(obj=key, off=off)
                off += len(f)
            if self.store.put(key, blob, create_only=True):
                with nb_lock:
                    new_bytes += len(blob)
                    new_objects += 1
            else:
                self.store.touch(key)  # found there: perhaps an orphan a concurrent gc is about to delete

        def add_to_pack(entry: dict[str, Any], frame: bytes) -> None:
            nonlocal pack, pack_n
            full: list[tuple[dict[str, Any], bytes]] | None = None
            with pack_lock:
                if pack and pack_n + len(frame) > pack_at:
                    full, pack, pack_n = pack, [], 0
                pack.append((entry, frame))
                pack_n += len(frame)
            if full:
                upload_pack(full)

        def encode(item: tuple[int, Any, Any, bool]) -> tuple[int, dict[str, Any], bytes | None]:
            nonlocal new_bytes, new_objects, reused_bytes
            from ._codec import encode_chunk

            k, base_arr, base_entry, check = item
            if check and self._h(base_arr.data) != base_entry["raw"]:
                # restored bytes that were changed in place since: no delta against them
                base_arr = base_entry = None
            leaf, i, o, ln = work[k]
            raw = leaf.data[o : o + ln]
            h = self._h(raw.data)
            reuse: dict[str, Any] | None = known.get(h)
            if reuse is None:
                with nb_lock:
                    first = claimed.setdefault(h, k)
                if first != k:
                    reuse = {"$same": first}
            if reuse is not None:
                with nb_lock:
                    reused_bytes += ln
                prog.add(ln)
                return k, reuse, None
            # a chunk reuses the encoding chosen for it by an earlier save (the best transform, order and
            # rotation of a tensor change slowly); the choice is searched afresh every few saves
            kind = (leaf.name, i, leaf.dtype, base_arr is not None)
            cached = self._hints.get(kind)
            hint = cached[0] if cached is not None and self._seq - cached[1] < _HINT_SAVES else None
            chosen: dict[str, Any] = {}
            frame, t = encode_chunk(raw, leaf.width, base_arr, level=self.level, hint=hint, chosen=chosen)
            if hint is None and "hint" in chosen:
                self._hints[kind] = (chosen["hint"], self._seq)
            entry: dict[str, Any] = {"raw": h, "len": ln, "t": t, "size": len(frame)}
            if t in ("xor", "sub") and base_entry is not None:
                entry["base"] = base_entry
                entry["depth"] = int(base_entry.get("depth", 0)) + 1
            else:
                entry["depth"] = 0
            fh = self._h(frame)
            entry["hash"] = fh
            if len(frame) >= self.pack_bytes:
                key = _obj_key(fh)
                wrote = self.store.put(key, frame, create_only=True)
                entry.update(obj=key, off=0)
                if wrote:
                    with nb_lock:
                        new_bytes += len(frame)
                        new_objects += 1
                else:
                    self.store.touch(key)  # (as for packs)
                prog.add(ln)
                return k, entry, None
            add_to_pack(entry, frame)
            prog.add(ln)
            return k, entry, None

        def encode_all(
            items: list[tuple[int, Any, Any, bool]],
        ) -> list[tuple[int, dict[str, Any], bytes | None]]:
            return [encode(it) for it in items]

        tiny = [p for p in plan if work[p[0]][3] < _TINY_BYTES]
        batches = ([tiny] if tiny else []) + [[p] for p in plan if work[p[0]][3] >= _TINY_BYTES]
        futs = [self._pool.submit(encode_all, b) for b in batches]
        results: list[tuple[int, dict[str, Any], bytes | None]] = []
        try:
            for f in futs:
                results.extend(f.result())
        except BaseException:
            for f in futs:
                f.cancel()
            cf.wait(futs)  # nothing of this save runs on once it has failed
            raise
        if pack:  # the last, partly filled pack
            upload_pack(pack)
        entries: dict[int, dict[str, Any]] = {k: entry for k, entry, _ in results}
        for k, e in list(entries.items()):
            if "$same" in e:
                entries[k] = entries[e["$same"]]
        # 4) assemble this rank's shard
        leaves_doc: dict[str, Any] = {}
        pos = 0
        for leaf in snap.leaves:
            n_chunks = len(self._chunks_of(leaf))
            chunks = [entries[pos + j] for j in range(n_chunks)]
            pos += n_chunks
            leaves_doc[leaf.name] = {
                "kind": leaf.kind,
                "dtype": leaf.dtype,
                "shape": leaf.shape,
                "nbytes": leaf.nbytes,
                "chunks": chunks,
            }
        shard = {"rank": self.rank, "tree": snap.tree, "leaves": leaves_doc}
        stats = {
            "raw_bytes": total,
            "new_bytes": new_bytes,
            "new_objects": new_objects,
            "reused_bytes": reused_bytes,
            "stall_s": round(snap.stall_s, 6),
            "persist_s": round(time.perf_counter() - t_start, 6),
        }
        info = self._commit(snap, ckpt_id, shard, stats, is_base)
        self._rates[is_base] = total / max(1e-6, time.perf_counter() - t_start)
        self._new_bytes[is_base] = new_bytes
        self._last_raw = total
        prog.finish()
        # 5) the committed snapshot becomes the base of the next delta; the old base's buffers are reused
        old = self._shadow
        self._shadow = {
            leaf.name: {
                "dtype": leaf.dtype,
                "nbytes": leaf.nbytes,
                "data": leaf.data,
                "chunks": leaves_doc[leaf.name]["chunks"],
            }
            for leaf in snap.leaves
        }
        self._parent = ckpt_id
        self._since_base = 0 if is_base else self._since_base + 1
        self._recycle(old)
        if not old:  # the first save: the next one has no buffers to recycle yet; fault them in next, on this
            # thread but after this save's handle has resolved (its caller need not wait for them)
            try:
                self._executor.submit(self._prefault, snap.leaves)
            except RuntimeError:  # closed meanwhile
                pass
        return info

    def _writer_info(self) -> dict[str, Any]:
        info = {**_static_writer_info(), "pid": os.getpid()}
        if "torch" in sys.modules:  # may be imported after the first save
            info["torch"] = sys.modules["torch"].__version__
        return info

    def _commit(
        self, snap: _Snapshot, ckpt_id: str, shard: dict[str, Any], stats: dict[str, Any], is_base: bool
    ) -> CheckpointInfo | None:
        shards = [shard]
        replicated = self.world_size == 1 or not self.sharded
        if self.sharded:
            if self.rank != 0:
                key = f"{SHARD_PREFIX}{ckpt_id}/rank-{self.rank:05d}.json"
                self.store.put(key, json.dumps({"shard": shard, "stats": stats}).encode(), create_only=True)
                self.last_info = None
                return None
            # rank 0 gathers the other ranks' shard records from the store, then commits
            deadline = time.monotonic() + self.commit_timeout_s
            for r in range(1, self.world_size):
                key = f"{SHARD_PREFIX}{ckpt_id}/rank-{r:05d}.json"
                delay = 0.05
                while True:
                    try:
                        rec = json.loads(self.store.get(key))
                        break
                    except ObjectMissingError:
                        if time.monotonic() > deadline:
                            raise CheckpointError(
                                f"checkpoint {ckpt_id}: rank {r} did not save its shard within "
                                f"{self.commit_timeout_s:.0f} s; the checkpoint is not committed"
                            ) from None
                        time.sleep(delay)
                        delay = min(1.0, delay * 2)
                shards.append(rec["shard"])
                for k in ("raw_bytes", "new_bytes", "new_objects", "reused_bytes"):
                    stats[k] += rec["stats"].get(k, 0)
            sig = [{n: [c["raw"] for c in lf["chunks"]] for n, lf in s["leaves"].items()} for s in shards]
            replicated = all(s == sig[0] for s in sig) and all(s["tree"] == shards[0]["tree"] for s in shards)
        doc = {
            "format": FORMAT_NAME,
            "version": self._version,
            "id": ckpt_id,
            "step": snap.step,
            "created_at": snap.created_at,
            "committed_at": time.time(),
            "parent": self._parent,
            "is_base": is_base,
            "world_size": self.world_size,
            "sharded": self.sharded,
            "replicated": replicated,
            "writer": self._writer_info(),
            "stats": stats,
            "shards": shards,
        }
        data = json.dumps(doc, separators=(",", ":")).encode()
        if not self.store.put(manifest_key(ckpt_id), data, create_only=True):
            # an earlier attempt of this very save may have been committed with its answer lost (a dropped
            # connection after the server stored it): then it is ours, and committed; anything else is refused
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
            doc = there
        if self.sharded:
            for r in range(1, self.world_size):
                self.store.delete(f"{SHARD_PREFIX}{ckpt_id}/rank-{r:05d}.json")
        info = CheckpointInfo.from_manifest(doc)
        self.last_info = info
        return info

    # ------------------------------------------------------------------ query
    def list(self) -> CheckpointList:
        """All committed checkpoints, oldest first (by step, then commit time)."""
        out = CheckpointList()
        self.unreadable: list[tuple[str, CheckpointError]] = []
        new: list[str] = []
        for o in self.store.list(MANIFEST_PREFIX):
            cid = id_from_key(o.key)
            if cid is None:
                continue
            cached = self._info_cache.get(cid)  # manifests are immutable: read each one once
            if cached is not None:
                out.append(cached)
            else:
                new.append(cid)

        def read(cid: str) -> CheckpointInfo | CheckpointError:
            try:
                return CheckpointInfo.from_manifest(read_manifest(self.store, cid))
            except StoreError:
                raise  # the store failed (endpoint down, access denied): not a damaged manifest to skip
            except CheckpointError as e:
                return e

        # the manifests not read before, several at a time (a round trip each on S3)
        n = min(len(new), max(self.threads, int(getattr(self.store, "max_concurrency", 0))))
        if n > 1:
            with cf.ThreadPoolExecutor(max_workers=n, thread_name_prefix="gnb-ckpt-list") as ex:
                got = list(ex.map(read, new))
        else:
            got = [read(cid) for cid in new]
        for cid, r in zip(new, got, strict=True):
            if isinstance(r, CheckpointError):
                log.warning("skipping unreadable manifest %s: %s", manifest_key(cid), r)
                self.unreadable.append((cid, r))
            else:
                self._info_cache[cid] = r
                out.append(r)
        out.sort(key=lambda c: (c.step, c.created_at, c.id))
        return out

    def latest(self) -> CheckpointInfo | None:
        """The newest checkpoint (highest step, then latest), or None if the store is empty."""
        try:
            return CheckpointInfo.from_manifest(self._newest(None))
        except NoCheckpointError:
            return None

    def _newest(self, step: int | None) -> dict[str, Any]:
        """The manifest of the newest checkpoint (at ``step``, if given). Ids start with the step, so only the
        manifests of the highest step (or of ``step``) are read: finding the latest checkpoint, what a resume
        does, costs one listing and a GET or two however many checkpoints the store holds. A manifest of a
        newer format version raises (it must not be skipped silently); an unreadable one is skipped."""
        by_step: dict[int, list[str]] = {}
        for o in self.store.list(MANIFEST_PREFIX):
            cid = id_from_key(o.key)
            head = cid.split("-", 1)[0] if cid else ""
            if cid and head.isdigit():
                by_step.setdefault(int(head), []).append(cid)
        steps = [step] if step is not None else sorted(by_step, reverse=True)
        for st in steps:
            docs = []
            for cid in by_step.get(st, []):
                try:
                    docs.append(read_manifest(self.store, cid))
                except (FormatVersionError, StoreError):
                    raise  # never resume from an older checkpoint because the newest one could not be fetched
                except CheckpointError as e:
                    log.warning("skipping unreadable manifest of %s: %s", cid, e)
            if docs:
                return max(docs, key=lambda d: (float(d.get("created_at", 0.0)), str(d["id"])))
        if step is not None:
            raise NoCheckpointError(f"no checkpoint at step {step} in {self.store.url}")
        raise NoCheckpointError(f"no checkpoint in {self.store.url}")

    def _resolve(self, ckpt_id: str | None, step: int | None) -> dict[str, Any]:
        if ckpt_id not in (None, "latest") and step is not None:
            raise ValueError(f"give a checkpoint id or a step, not both (id {ckpt_id!r}, step {step})")
        if ckpt_id is not None:
            if ckpt_id == "latest":
                ckpt_id = None
            else:
                try:  # a whole id: one request
                    return read_manifest(self.store, ckpt_id)
                except NoCheckpointError:  # else a unique prefix of one
                    matches = [o for o in self.store.list(MANIFEST_PREFIX + ckpt_id) if id_from_key(o.key)]
                    if len(matches) > 1:
                        few = ", ".join(str(id_from_key(o.key)) for o in matches[:5])
                        more = f" and {len(matches) - 5} more" if len(matches) > 5 else ""
                        raise NoCheckpointError(
                            f"checkpoint id prefix {ckpt_id!r} is ambiguous: it matches {len(matches)} "
                            f"checkpoints ({few}{more}); give more of the id"
                        ) from None
                    if not matches:
                        raise
                    return read_manifest(self.store, id_from_key(matches[0].key))  # type: ignore[arg-type]
        return self._newest(step)

    def manifest(self, ckpt_id: str | None = None) -> dict[str, Any]:
        """The raw manifest of a checkpoint (latest by default)."""
        return self._resolve(ckpt_id, None)

    def show(self, ckpt_id: str | None = None) -> dict[str, Any]:
        """Summary of one checkpoint: info, and per tensor dtype/shape/chunks/transforms/stored bytes."""
        doc = self._resolve(ckpt_id, None)
        tensors = {}
        frames = restore_frames(
            c for sh in doc["shards"] for lf in sh["leaves"].values() for c in lf["chunks"]
        )
        for shard in doc["shards"]:
            for name, lf in shard["leaves"].items():
                ts: dict[str, int] = {}
                for c in lf["chunks"]:
                    ts[c["t"]] = ts.get(c["t"], 0) + 1
                label = name if len(doc["shards"]) == 1 else f"rank{shard['rank']}:{name}"
                tensors[label] = {
                    "dtype": lf["dtype"],
                    "shape": lf["shape"],
                    "nbytes": lf["nbytes"],
                    "stored": sum(c["size"] for c in lf["chunks"]),
                    "chunks": len(lf["chunks"]),
                    "transforms": ts,
                    "max_depth": max((c.get("depth", 0) for c in lf["chunks"]), default=0),
                }
        return _Show(
            info=CheckpointInfo.from_manifest(doc),
            restore={
                "bytes": sum(frames.values()),
                "objects": len({k for k, _ in frames}),
                "max_depth": max((t["max_depth"] for t in tensors.values()), default=0),
            },
            stats=doc.get("stats", {}),
            writer=doc.get("writer", {}),
            tensors=tensors,
        )

    def diff(self, a: str, b: str) -> DiffResult:
        """Compare two checkpoints: which tensors/chunks changed (by content hash) and which plain values."""
        da, db = self._resolve(a, None), self._resolve(b, None)
        la = {n: lf for s in da["shards"] for n, lf in s["leaves"].items()}
        lb = {n: lf for s in db["shards"] for n, lf in s["leaves"].items()}
        changed: dict[str, Any] = {}
        unchanged: list[str] = []
        for n in la.keys() & lb.keys():
            ca = [c["raw"] for c in la[n]["chunks"]]
            cb = [c["raw"] for c in lb[n]["chunks"]]
            if ca == cb and la[n]["shape"] == lb[n]["shape"] and la[n]["dtype"] == lb[n]["dtype"]:
                unchanged.append(n)
            else:
                nch = sum(1 for x, y in zip(ca, cb, strict=False) if x != y) + abs(len(ca) - len(cb))
                changed[n] = {"chunks": len(cb), "chunks_changed": nch}
        values: dict[str, Any] = {}
        _diff_values(da["shards"][0]["tree"], db["shards"][0]["tree"], "", values)
        return DiffResult(
            a=da["id"],
            b=db["id"],
            changed=dict(sorted(changed.items())),
            unchanged=sorted(unchanged),
            added=sorted(lb.keys() - la.keys()),
            removed=sorted(la.keys() - lb.keys()),
            values=values,
        )

    # ------------------------------------------------------------------ restore
    def restore(
        self,
        ckpt_id: str | None = None,
        *,
        step: int | None = None,
        into: Any = None,
        allow_pickle: bool | None = None,
        verify: bool = True,
        missing_ok: bool = False,
        map_location: Any = None,
        fallback: bool = False,
    ) -> Any:
        """Load a checkpoint (latest by default) and return its state.

        Parameters
        ----------
        ckpt_id
            Checkpoint id (or a unique prefix, or ``"latest"``).
        step
            Restore the newest checkpoint at this step.
        into
            Objects to load into in place, shaped like the saved state: e.g. ``{"model": model,
            "optim": optimizer}``. Objects with ``load_state_dict`` get their state dict; tensors are
            copied into; dicts and lists are matched key by key. Shapes are checked first.
        allow_pickle
            Allow pickled values (default: the Checkpointer's setting).
        verify
            Check every chunk's decoded bytes against its hash (a delta chain end to end).
        missing_ok
            Return None instead of raising :class:`NoCheckpointError` when the store is empty.
        map_location
            Move restored tensors to this device.
        fallback
            For the latest checkpoint (no ``ckpt_id`` or ``step``): when its data is missing or corrupted
            (:class:`ObjectMissingError`, :class:`IntegrityError`: a lost object, a partial copy of the store),
            restore the newest older checkpoint that is intact instead, with a warning naming each one skipped
            and why. Meant for resuming a run; without it the error is raised. Other errors are always raised.
            In a job with a process group (``world_size`` > 1), every rank must call it (as with
            :meth:`maybe_save`): the ranks agree, so that all of them restore the same checkpoint.

        Returns
        -------
        The saved state with modules/optimizers replaced by their state dicts (plain values as saved).

        Raises
        ------
        NoCheckpointError, IntegrityError, ObjectMissingError, FormatVersionError, ShapeMismatchError
        """
        _set_current(self)
        self._wait_inflight()
        try:
            doc = self._resolve(ckpt_id, step)
        except NoCheckpointError:
            if missing_ok:
                return None
            raise
        allow = self.allow_pickle if allow_pickle is None else allow_pickle
        older: list[str] = []
        together = False  # ranks of a process group fall back together (each restores its own shard)
        if fallback and ckpt_id in (None, "latest") and step is None:
            ids = [c.id for c in self.list()]  # oldest first
            if doc["id"] in ids:
                older = ids[: ids.index(doc["id"])][::-1]
            n_older = self._agree_min(len(older)) if self.world_size > 1 else None
            together = n_older is not None
            if n_older is not None:
                older = older[:n_older]  # the same candidates on every rank
        first: CheckpointError | None = None  # the error of the checkpoint asked for
        while True:
            shard = self._pick_shard(doc)
            err: CheckpointError | None = None
            try:
                values, datas = self._decode_shard(doc, shard, verify=verify, allow_pickle=allow)
            except (ObjectMissingError, IntegrityError) as e:
                if not fallback:
                    raise
                err = e
            if together:  # a collective: every rank takes part in every round
                everyone = self._agree_min(0 if err else 1)
                if everyone == 0 and err is None:
                    err = IntegrityError(f"another rank could not restore its part of checkpoint {doc['id']}")
            if err is None:
                break
            # this checkpoint cannot be restored (here, or on another rank): the one before it
            if first is None:
                first = err
            else:
                first.add_note(
                    f"older checkpoint {doc['id']} (step {doc['step']}) cannot be restored either: {err}"
                )
            if not older:
                if first is err:
                    raise err
                raise first from None
            warnings.warn(
                f"checkpoint {doc['id']} (step {doc['step']}) cannot be restored ({err}); restoring the one "
                f"before it, {older[0]}",
                RuntimeWarning,
                stacklevel=2,
            )
            doc = read_manifest(self.store, older.pop(0))
        if map_location is not None:
            for k, v in list(values.items()):
                if hasattr(v, "to") and not isinstance(v, np.ndarray):
                    values[k] = v.to(map_location)
        state = unflatten(shard["tree"], values)
        if into is not None:
            _load_into(into, state, shard["tree"])
        # continue the delta chain from what was restored (a checkpoint hashed otherwise than this writer
        # hashes, e.g. format version 2: the next save is a full base)
        if (not doc.get("sharded") or shard["rank"] == self.rank) and doc_hash(doc) == self.hash:
            self._shadow = {
                name: {
                    "dtype": lf["dtype"],
                    "nbytes": lf["nbytes"],
                    "data": datas[name],
                    "chunks": lf["chunks"],
                    "check": True,  # the caller's tensors share this memory: hash it before a delta uses it
                }
                for name, lf in shard["leaves"].items()
            }
            self._parent = doc["id"]
            depth = max(
                (c.get("depth", 0) for lf in shard["leaves"].values() for c in lf["chunks"]), default=0
            )
            self._since_base = 0 if doc.get("is_base") else depth
        elif doc_hash(doc) != self.hash:
            self._shadow = {}  # nothing to compute a delta against: the next save is a full base
        self._last_save_step = int(doc.get("step", 0))
        self._last_save_time = time.time()
        self.last_info = CheckpointInfo.from_manifest(doc)
        return state

    def _pick_shard(self, doc: dict[str, Any]) -> dict[str, Any]:
        shards = doc["shards"]
        ws = int(doc.get("world_size", 1))
        if len(shards) == 1 or doc.get("replicated", False):
            return shards[0]
        if ws != self.world_size:
            raise CheckpointError(
                f"checkpoint {doc['id']} has {len(shards)} different shards (world size {ws}); it can only be "
                f"restored onto world size {ws}, not {self.world_size} (only replicated state can change world size)"
            )
        for s in shards:
            if s["rank"] == self.rank:
                return s
        raise CheckpointError(f"checkpoint {doc['id']} has no shard for rank {self.rank}")

    def _decode_shard(
        self, doc: dict[str, Any], shard: dict[str, Any], verify: bool, allow_pickle: bool
    ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        from ._codec import decode_chunk

        hv = hash_fn(doc_hash(doc))  # the hash this checkpoint was written with
        leaves = shard["leaves"]
        # refuse pickles before fetching anything
        if not allow_pickle:
            for name, lf in leaves.items():
                if lf.get("kind") == "pickle":
                    leaf_from_bytes({**lf, "name": name}, np.zeros(0, np.uint8), allow_pickle=False)
        total = sum(lf["nbytes"] for lf in leaves.values())
        prog = Progress(f"restore {doc['id']}", total, self.progress)
        # every chunk is one chain of frames (a full frame, then the deltas on it, oldest first), decoded in
        # place into the memory of the tensor handed back: the base frame into it, then each delta over it. The
        # same bytes twice (tied weights) are decoded once and copied.
        datas: dict[str, np.ndarray] = {}
        chains: list[_Chain] = []
        copies: list[tuple[_Chain, np.ndarray]] = []  # (the chain that decodes these bytes, another home)
        first_of: dict[str, _Chain] = {}
        for name, lf in leaves.items():
            n = int(lf["nbytes"])
            if sum(int(c["len"]) for c in lf["chunks"]) != n:
                raise IntegrityError(
                    f"tensor {name!r} of checkpoint {doc['id']} has chunks that do not add up to {n} bytes"
                )
            datas[name] = np.empty(n, dtype=np.uint8)
            off = 0
            for i, c in enumerate(lf["chunks"]):
                ln = int(c["len"])
                dst = datas[name][off : off + ln]
                off += ln
                same = first_of.get(c["raw"])
                if same is not None and same.entry["len"] == ln:
                    copies.append((same, dst))
                    continue
                ch = _Chain(name, i, c, walk_chunks(c)[::-1], dst)
                first_of[c["raw"]] = ch
                chains.append(ch)
        # read-ahead: every frame this restore needs, grouped into ranged reads of nearby frames of one object
        # (at most pack_max bytes, gaps under _GAP_BYTES), requested at once by their own pool (I/O bound: as
        # many in flight as the store allows), the objects holding the oldest frames of the chains first (the
        # first thing every chain decodes); a read's bytes are dropped once its last frame is decoded. (Reads
        # are not split further: a save's several packs already come down in parallel, and some S3-compatible
        # servers read a whole object for every ranged GET.)
        frames_of: dict[str, dict[int, int]] = {}  # object -> frame offset -> size
        age: dict[str, int] = {}  # object -> how far from the end of a chain its oldest frame is
        chains.sort(key=lambda ch: -int(ch.entry["len"]))  # big first: the threads finish together
        for ch in chains:
            for k, e in enumerate(ch.chain):
                fr = frames_of.setdefault(e["obj"], {})
                fr[int(e["off"])] = int(e["size"])
                age[e["obj"]] = max(age.get(e["obj"], 0), len(ch.chain) - 1 - k)
        order = sorted(frames_of, key=lambda key: -age[key])  # stable: then by first use
        io_threads = max(self.threads, int(getattr(self.store, "max_concurrency", 0)))
        groups: list[tuple[str, int, int]] = []  # object, start, end
        group_of: dict[tuple[str, int], int] = {}
        for key in order:
            lo = hi = -1
            members: list[int] = []
            for off, size in sorted(frames_of[key].items()):
                end = off + size
                if members and (end - lo > self.pack_max or off - hi > _GAP_BYTES):
                    groups.append((key, lo, hi))
                    members = []
                if not members:
                    lo, hi = off, end
                members.append(off)
                hi = max(hi, end)
                group_of[(key, off)] = len(groups)
            if members:
                groups.append((key, lo, hi))
        left = [0] * len(groups)
        for ch in chains:
            ch.groups = [group_of[(e["obj"], int(e["off"]))] for e in ch.chain]
            for gi in ch.groups:
                left[gi] += 1
        fetch_pool = cf.ThreadPoolExecutor(max_workers=io_threads, thread_name_prefix="gnb-ckpt-fetch")

        def read_group(g: tuple[str, int, int]) -> bytes | memoryview:
            key, lo, hi = g
            return self.store.get_range(key, lo, hi - lo)

        futures: dict[int, cf.Future[bytes | memoryview]] = {
            i: fetch_pool.submit(read_group, g) for i, g in enumerate(groups)
        }
        left_lock = threading.Lock()

        def where(name: str, idx: int, e: dict[str, Any]) -> str:
            return f"tensor {name!r} chunk {idx} (object {e['obj']}) of checkpoint {doc['id']}"

        def fetch(name: str, idx: int, e: dict[str, Any], reread: bool = False) -> bytes | memoryview:
            key = e["obj"]
            gi = group_of[(key, int(e["off"]))]
            try:
                if reread:
                    return self.store.get_range(key, e["off"], e["size"])
                blob = futures[gi].result()
            except ObjectMissingError:
                raise ObjectMissingError(key, f"needed by {where(name, idx, e)}") from None
            with left_lock:
                left[gi] -= 1
                if left[gi] <= 0:
                    futures.pop(gi, None)  # the last frame of this read: let its bytes go
            o = int(e["off"]) - groups[gi][1]
            if o or len(blob) != e["size"]:
                return memoryview(blob)[o : o + int(e["size"])]  # no copy
            return blob

        def corrupt_frame(
            name: str, idx: int, e: dict[str, Any], frame: bytes | memoryview
        ) -> IntegrityError | None:
            if len(frame) != e["size"] or hv(frame) != e["hash"]:
                return IntegrityError(
                    f"corrupted data: stored bytes of {where(name, idx, e)} do not match their hash"
                )
            return None

        def diagnose(name: str, idx: int, e: dict[str, Any]) -> IntegrityError:
            """Find which frame of a chain that decoded to the wrong bytes is at fault (slow path)."""
            chain = walk_chunks(e)
            for link in reversed(chain):  # oldest base first
                frame = fetch(name, idx, link, reread=True)
                err = corrupt_frame(name, idx, link, frame)
                if err is not None:
                    return err
            return IntegrityError(
                f"corrupted data: decoded bytes of {where(name, idx, e)} do not match their hash"
            )

        def step(ch: _Chain) -> None:
            """Decode the next frame of a chain (its bytes have arrived) into the chain's memory."""
            e = ch.chain[ch.level]
            frame = fetch(ch.name, ch.idx, e)
            try:
                decode_chunk(frame, ch.dst if ch.level else None, ch.dst)
            except ValueError as err:
                raise corrupt_frame(ch.name, ch.idx, e, frame) or diagnose(ch.name, ch.idx, ch.entry) from err
            ch.level += 1
            if ch.level == len(ch.chain):
                # a delta's decoded bytes depend on every byte of its base: checking the end checks the chain
                if verify and hv(ch.dst.data) != ch.entry["raw"]:
                    raise diagnose(ch.name, ch.idx, ch.entry)
                prog.add(int(ch.entry["len"]))

        # a chain's next frame is decoded as soon as its bytes are here, by whichever thread is free; a thread
        # goes on with the same chain while it can (its bytes are still in the cache). With a local store
        # everything is here at once: each chain is decoded start to end in one go; from S3 the old frames
        # (fetched first) are decoded while the newer ones are still coming in.
        cond = threading.Condition()
        arrived: set[int] = set()
        waiting: dict[int, list[_Chain]] = {}
        # work for the threads: one chain, or the tiny chains together (they cost more in locking and Python
        # than in decoding: one thread goes through them while the others decode big chains in C)
        ready: collections.deque[list[_Chain]] = collections.deque()
        todo = [len(chains)]
        failed: list[BaseException] = []

        def wait_for(ch: _Chain) -> bool:
            """With ``cond`` held: True if the chain's next frame is here, else park it until it is."""
            gi = ch.groups[ch.level]
            if gi in arrived:
                return True
            waiting.setdefault(gi, []).append(ch)
            return False

        def make_ready(chs: list[_Chain]) -> None:
            """With ``cond`` held: queue chains whose next frame is here, the tiny ones together and first, then
            the big ones biggest first (so that the threads finish together)."""
            tiny = [ch for ch in chs if int(ch.entry["len"]) < _TINY_BYTES]
            if tiny:
                ready.append(tiny)
            ready.extend([ch] for ch in chs if int(ch.entry["len"]) >= _TINY_BYTES)
            cond.notify_all()

        def on_arrival(gi: int) -> None:
            with cond:
                arrived.add(gi)
                make_ready(waiting.pop(gi, []))

        with cond:
            make_ready([ch for ch in chains if wait_for(ch)])
        for gi, fut in list(futures.items()):
            fut.add_done_callback(lambda _f, gi=gi: on_arrival(gi))  # type: ignore[misc]

        def worker() -> None:
            while True:
                with cond:
                    while not ready and todo[0] and not failed:
                        cond.wait()
                    if failed or not todo[0]:
                        return
                    item = ready.popleft()
                try:
                    for ch in item:
                        while True:
                            step(ch)
                            with cond:
                                if ch.level == len(ch.chain):
                                    todo[0] -= 1
                                    if not todo[0]:
                                        cond.notify_all()
                                    break
                                if not wait_for(ch):
                                    break
                except BaseException as err:  # noqa: BLE001 - handed to the caller below
                    with cond:
                        failed.append(err)
                        cond.notify_all()
                    return

        try:
            n_workers = max(1, min(self.threads, len(chains)))
            if n_workers > 1:
                pool = cf.ThreadPoolExecutor(max_workers=n_workers, thread_name_prefix="gnb-ckpt-restore")
                try:
                    for f in [pool.submit(worker) for _ in range(n_workers)]:
                        f.result()
                except BaseException:  # e.g. KeyboardInterrupt: the workers stop at their next frame
                    with cond:
                        failed.append(CheckpointError("restore interrupted"))
                        cond.notify_all()
                    raise
                finally:
                    pool.shutdown(wait=True, cancel_futures=True)
            else:
                worker()
        finally:
            fetch_pool.shutdown(wait=True, cancel_futures=True)
        if failed:
            raise failed[0]
        for src, dst in copies:
            dst[:] = src.dst
            prog.add(dst.nbytes)
        prog.finish()
        values: dict[str, Any] = {}
        for name, lf in leaves.items():
            values[name] = leaf_from_bytes({**lf, "name": name}, datas[name], allow_pickle=allow_pickle)
        return values, datas

    # ------------------------------------------------------------------ gc
    def gc(self, keep: int = 3, grace_s: float = 3600.0, dry_run: bool = False) -> GcResult:
        """Delete all but the newest ``keep`` checkpoints and every object no kept checkpoint needs.

        Objects referenced by a kept checkpoint (including the bases of its delta chains) are never deleted.
        Unreferenced objects newer than ``grace_s`` seconds are kept too: they may belong to a save that is
        still uploading. A manifest that cannot be read (damaged, or of a newer format version than this
        library's) makes gc refuse before it deletes anything: the objects it needs cannot be told apart.
        """
        if keep < 1:
            raise ValueError("keep must be >= 1")
        if not dry_run:
            self._check_writable("gc")
        self.wait()
        lst = self.list()

        def refuse(cid: str, err: CheckpointError) -> CheckpointError:
            return CheckpointError(
                f"gc refused, nothing deleted: manifest {manifest_key(cid)} cannot be read ({err}), so the objects "
                f"it needs are unknown. "
                + (
                    "It was written by a newer version of gpu_notebook: run gc with that version."
                    if isinstance(err, FormatVersionError)
                    else "Restore or delete that checkpoint by hand first."
                )
            )

        for bad, err in self.unreadable:
            if not isinstance(err, NoCheckpointError | ObjectMissingError):  # (gone since it was listed)
                raise refuse(bad, err) from err
        kept, drop = lst[-keep:], lst[:-keep]
        needed: set[str] = set()
        for c in kept:
            needed |= manifest_objects(read_manifest(self.store, c.id))
        res = GcResult(kept=[c.id for c in kept], manifests=[], objects=[], bytes=0)
        for c in drop:
            if not dry_run:
                self.store.delete(manifest_key(c.id))
            res["manifests"].append(c.id)
        now = time.time()
        # re-read after deleting: a manifest committed meanwhile protects its objects (one that cannot be read
        # stops gc before any object is deleted)
        for o in self.store.list(MANIFEST_PREFIX):
            cid = id_from_key(o.key)
            if cid and cid not in res["kept"] and cid not in res["manifests"]:
                try:
                    needed |= manifest_objects(read_manifest(self.store, cid))
                except (NoCheckpointError, ObjectMissingError):
                    continue  # deleted since it was listed
                except CheckpointError as e:
                    raise refuse(cid, e) from e
        for o in self.store.list(OBJECT_PREFIX):
            if o.key in needed or now - o.mtime < grace_s:
                continue
            if not dry_run:
                self.store.delete(o.key)
            res["objects"].append(o.key)
            res["bytes"] += o.size
        for o in self.store.list(SHARD_PREFIX):
            if now - o.mtime >= grace_s and not dry_run:
                self.store.delete(o.key)
        return res


class _Show(dict):  # type: ignore[type-arg]
    def __repr__(self) -> str:
        info = self["info"]
        st = self["stats"]
        lines = [
            repr(info),
            f"  parent={info.parent} world_size={info.world_size} writer={self['writer'].get('lib')} "
            f"{self['writer'].get('version', '')} host={self['writer'].get('host', '')}",
            f"  snapshot stall {st.get('stall_s', 0):.3f} s, persist {st.get('persist_s', 0):.3f} s, "
            f"{st.get('new_objects', 0)} new object(s)",
        ]
        rs = self.get("restore")
        if rs:
            raw = max(1, int(st.get("raw_bytes", 0)))
            lines.append(
                f"  a restore reads {_fmt_bytes(rs['bytes'])} ({rs['bytes'] / raw:.2f}x the state) from {rs['objects']} "
                f"object(s): delta chains up to {rs['max_depth']} deep (bounded by full_every and max_restore_ratio)"
            )
        for name, t in list(self["tensors"].items())[:50]:
            tr = ",".join(f"{k}:{v}" for k, v in t["transforms"].items())
            lines.append(
                f"  {name:40s} {t['dtype']:9s} {str(t['shape']):18s} {t['nbytes']:>11d} B -> "
                f"{t['stored']:>11d} B  [{tr}] depth {t['max_depth']}"
            )
        if len(self["tensors"]) > 50:
            lines.append(f"  ... {len(self['tensors']) - 50} more tensors")
        return "\n".join(lines)


def _diff_values(a: Any, b: Any, path: str, out: dict[str, Any]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        if len(a) == 1 and len(b) == 1:
            ((ka, va),) = a.items()
            ((kb, vb),) = b.items()
            if ka in ("$tensor", "$ndarray", "$pickle") or kb in ("$tensor", "$ndarray", "$pickle"):
                return
            if ka == kb == "$state":
                _diff_values(va["value"], vb["value"], path, out)
                return
        for k in a.keys() | b.keys():
            _diff_values(a.get(k), b.get(k), f"{path}/{k}" if path else str(k), out)
        return
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _diff_values(x, y, f"{path}/{i}", out)
        return
    if a != b:
        out[path or "<root>"] = (a, b)


def _shape_of(v: Any) -> tuple[tuple[int, ...], str] | None:
    if hasattr(v, "shape") and hasattr(v, "dtype"):
        return tuple(v.shape), str(v.dtype).replace("torch.", "")
    return None


def _load_into(target: Any, state: Any, tree: Any, path: str = "") -> None:
    """Load ``state`` into ``target`` in place, checking shapes first (all mismatches in one error)."""
    mismatches: list[tuple[str, object, object]] = []
    _check_shapes(target, state, path, mismatches)
    if mismatches:
        raise ShapeMismatchError(mismatches)
    _apply(target, state)


def _check_shapes(target: Any, state: Any, path: str, out: list[tuple[str, object, object]]) -> None:
    if hasattr(target, "load_state_dict") and hasattr(target, "state_dict"):
        try:
            import torch

            is_module = isinstance(target, torch.nn.Module)
        except ImportError:  # pragma: no cover
            is_module = False
        if not is_module and _check_optimizer(target, state, path, out):
            return
        if is_module and isinstance(state, dict):
            sd = target.state_dict()
            for k in sd.keys() | state.keys():
                name = f"{path}/{k}" if path else k
                if k not in state:
                    out.append((name, "missing", _shape_of(sd[k])))
                elif k not in sd:
                    out.append((name, _shape_of(state[k]), "not in target"))
                else:
                    a, b = _shape_of(state[k]), _shape_of(sd[k])
                    if a is not None and b is not None and a != b:
                        out.append((name, f"{list(a[0])} {a[1]}", f"{list(b[0])} {b[1]}"))
        return
    if isinstance(target, dict):
        if not isinstance(state, dict):
            out.append((path or "<root>", type(state).__name__, "dict"))
            return
        for k, v in target.items():
            if k in state:
                _check_shapes(v, state[k], f"{path}/{k}" if path else str(k), out)
            else:
                out.append((f"{path}/{k}" if path else str(k), "missing", type(v).__name__))
        return
    if isinstance(target, list | tuple) and isinstance(state, list | tuple):
        for i, (t, s) in enumerate(zip(target, state, strict=False)):
            _check_shapes(t, s, f"{path}/{i}", out)
        return
    a, b = _shape_of(state), _shape_of(target)
    if a is not None and b is not None and a != b:
        out.append((path or "<root>", f"{list(a[0])} {a[1]}", f"{list(b[0])} {b[1]}"))


#: per-parameter state of torch's optimizers shaped like its parameter (compared with it when an optimizer has no
#: state yet; others, e.g. Adafactor's factored moments, only with the optimizer's own state)
_PARAM_SHAPED = frozenset(
    ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "exp_inf", "momentum_buffer", "square_avg", "grad_avg",
     "acc_delta", "sum", "ax", "prev", "step_size")
)  # fmt: skip


def _check_optimizer(target: Any, state: Any, path: str, out: list[tuple[str, object, object]]) -> bool:
    """Check a ``torch.optim.Optimizer`` state dict against the optimizer (True when ``target`` is one): its
    parameter groups (torch refuses others in ``load_state_dict``, but only after the objects before it in
    ``into`` were loaded) and the shapes of its per-parameter state (which torch loads unchecked)."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(target, torch.optim.Optimizer):
        return False
    if not isinstance(state, dict) or not isinstance(state.get("param_groups"), list):
        return True  # load_state_dict says what is wrong
    saved, groups = state["param_groups"], target.param_groups
    where = f"{path}/param_groups" if path else "param_groups"
    if len(saved) != len(groups):
        out.append((where, f"{len(saved)} group(s)", f"{len(groups)} group(s)"))
        return True
    params: dict[Any, Any] = {}
    for i, (sg, g) in enumerate(zip(saved, groups, strict=True)):
        ids = list(sg.get("params", [])) if isinstance(sg, dict) else []
        if len(ids) != len(g["params"]):
            out.append((f"{where}/{i}", f"{len(ids)} parameter(s)", f"{len(g['params'])} parameter(s)"))
            continue
        params.update(zip(ids, g["params"], strict=True))
    builtin = type(target).__module__.startswith("torch.optim")
    per_param = state.get("state")
    for pid, st in per_param.items() if isinstance(per_param, dict) else []:
        p = params.get(pid)
        if p is None or not isinstance(st, dict):
            continue
        own = target.state.get(p, {})
        for k, v in st.items():
            a = _shape_of(v)
            if a is None or not a[0]:
                continue  # not a tensor, or a scalar (a step counter)
            b = _shape_of(own.get(k))
            if b is None and builtin and k in _PARAM_SHAPED:
                b = _shape_of(p)
            if b is not None and a[0] != b[0]:
                name = f"{path}/state/{pid}/{k}" if path else f"state/{pid}/{k}"
                out.append((name, f"{list(a[0])} {a[1]}", f"{list(b[0])} {b[1]}"))
    return True


def _apply(target: Any, state: Any) -> None:
    if hasattr(target, "load_state_dict"):
        target.load_state_dict(state)
        return
    if isinstance(target, dict):
        for k, v in target.items():
            if k in state:
                if (
                    _is_tensor(v)
                    or isinstance(v, np.ndarray)
                    or hasattr(v, "load_state_dict")
                    or isinstance(v, dict | list)
                ):
                    _apply(v, state[k])
        return
    if isinstance(target, list):
        for t, s in zip(target, state, strict=False):
            _apply(t, s)
        return
    if _is_tensor(target):
        import torch

        with torch.no_grad():
            target.copy_(state)
        return
    if isinstance(target, np.ndarray):
        target[...] = state


def _is_tensor(v: Any) -> bool:
    return "torch" in sys.modules and isinstance(v, sys.modules["torch"].Tensor)
