"""Snapshots: the host-memory copy of the state a save writes, and the pool of buffers it is copied into.

Taking a snapshot is the only work a save does on the training thread. By default each snapshot goes into fresh
memory, dropped once its save is committed (only the base that deltas are computed against stays): between saves
the host holds about one copy of the state besides the state itself, and the stall is about that of a plain host
copy (``clone()``). With ``reuse`` the buffers of the last snapshot are kept, and after the first save faulted in,
for the next one (a fresh allocation page-faults on first write, which lengthens the stall): a shorter stall for
one more copy of the state in host memory. Copies from a GPU go into page-locked buffers (asynchronous
device-to-host copies; see :func:`format.tree.flatten`), always reused: allocating them is slow.

Once a save's job has dropped its snapshot, :func:`trim_heap` hands the freed memory back to the system (glibc keeps
freed blocks below its mmap threshold, which grows to 32 MB as big blocks are freed, in its heaps for reuse: without
the trim a 40 MB state held about 0.6x of it more between saves).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
import time
import weakref
from typing import Any

import numpy as np

from ._progress import Progress
from .format._scratch import heap_empty, is_host_buffer, release_scratch
from .format.tree import Leaf, flatten

__all__ = ["Snapshot", "BufferPool", "GROUP_BYTES", "release_memory", "trim_heap"]

#: CPU tensors under this many bytes are copied into one group buffer per dtype and saved as one tensor (see
#: :mod:`format.tree`): 10,000 tensors of 1 KB then cost one copy call, chunk and frame instead of 10,000 each
GROUP_BYTES = 64 * 1024


_trim: Any = (
    None  # glibc's malloc_trim, False where there is none (macOS, musl, Windows); None: not looked up
)
_trim_lock = threading.Lock()


def trim_heap() -> bool:
    """Return the C heap's free memory to the system (glibc's ``malloc_trim(0)``, on the calling thread: a save's
    job, after it dropped its snapshot); False where the C library has no such call."""
    global _trim
    with _trim_lock:
        if _trim is None:
            _trim = False
            try:
                libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
                fn = getattr(libc, "malloc_trim", None)
                if fn is not None:
                    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
                    _trim = fn
            except OSError:  # no C library to load by that name: nothing to trim
                pass
    if _trim is False:
        return False
    _trim(0)
    return True


def release_memory() -> None:
    """After a save: drop the encoding threads' scratch buffers (the next save allocates them again) and hand
    the C heap's free memory back to the system (a save frees a snapshot-sized copy each time)."""
    release_scratch()
    trim_heap()


class Snapshot:
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
        """The bytes this snapshot holds (of a spread one: those this rank encodes)."""
        return sum(lf.nbytes for lf in self.leaves if not lf.remote)


class BufferPool:
    """Host buffers for snapshot copies, recycled by size: those no delta needs any more become free once the
    next save is committed (ordinary ones only with ``reuse``; page-locked ones always)."""

    def __init__(self, reuse: bool = False) -> None:
        self.reuse = reuse
        self._free: dict[int, list[np.ndarray]] = {}  # recycled snapshot buffers, by size
        self._free_pinned: dict[int, list[np.ndarray]] = {}  # ... page-locked ones (copies from GPUs)
        self._pinned: weakref.WeakValueDictionary[int, np.ndarray] = weakref.WeakValueDictionary()

    @property
    def n_pinned(self) -> int:
        """How many page-locked buffers this pool has handed out that are still alive."""
        return len(self._pinned)

    def take(self, state: Any, step: int, allow_pickle: bool) -> Snapshot:
        """Copy ``state`` into buffers of this pool (the training thread waits for this)."""
        t0 = time.perf_counter()
        tree, leaves = flatten(
            state, allow_pickle=allow_pickle, copy=True, alloc=self.alloc, group_bytes=GROUP_BYTES
        )
        return Snapshot(tree, leaves, step, time.perf_counter() - t0)

    def alloc(self, nbytes: int, pinned: bool = False) -> np.ndarray:
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
        return heap_empty(nbytes)

    def prefault(self, leaves: list[Leaf]) -> None:
        """Ordinary host buffers for the next snapshot, their pages touched (a fresh allocation page-faults on
        first write, which would otherwise lengthen the next save's training stall); only with ``reuse``."""
        if not self.reuse:
            return
        for leaf in leaves:
            d = leaf.data
            if (
                not isinstance(d, np.ndarray)
                or not d.nbytes
                or self._pinned.get(id(d)) is d
                or not is_host_buffer(d)
            ):
                continue
            buf = heap_empty(d.nbytes)
            buf.fill(0)
            self._free.setdefault(d.nbytes, []).append(buf)

    def recycle(self, shadow: dict[str, dict[str, Any]]) -> None:
        """Make the buffers of a snapshot no longer needed (``shadow``: what a delta was computed against) the
        free ones."""
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
            elif is_host_buffer(d) and self.reuse:
                free.setdefault(d.nbytes, []).append(d)
        self._free = free
        self._free_pinned = free_pinned
