"""Per-thread scratch buffers of the codec, and their release between saves.

Each thread that encodes or decodes chunks keeps a few chunk-sized ``uint8`` buffers (the transformed chunk, its
byte planes, a permutation), reused chunk after chunk: a fresh allocation page-faults, which is slow on some
hosts. Between saves they would hold about ``threads x 4 x chunk`` bytes, so a save's job drops them all when it
has ended (:func:`release_scratch`); the next save allocates them again.

Large buffers (these, and the packs of encoded frames: ``save/encode.py``) are anonymous memory maps
(:func:`host_empty`), so freeing one gives its pages back to the system at once. From ``malloc`` they did not
always go back: glibc raises its mmap threshold each time a large block is freed (up to 32 MiB), after which blocks
of that size come from its heaps, whose freed memory ``malloc_trim`` cannot return while a live block sits above it.
Between saves of a 40 MB state that kept 1.2-2.1x the state resident; with memory maps 1.15-1.19x
(``benchmarks/checkpoint.py``'s memory table). The snapshot's copies stay with ``malloc``: fresh maps page-fault on
every save, which doubled the training stall.
"""

from __future__ import annotations

import mmap
import sys
import threading
import weakref
from typing import Any

import numpy as np

__all__ = ["scratch", "release_scratch", "host_empty", "heap_empty", "is_host_buffer"]

#: private anonymous maps, as malloc makes: Python's default, a shared one, is shared memory (shmem), whose first
#: touch costs more (a fresh 40 MB: 18 ms against 14 here)
_PRIVATE = getattr(mmap, "MAP_PRIVATE", None)  # (None on Windows: no flags there)

#: from this size on, :func:`host_empty` maps memory of its own rather than asking ``malloc``
MAP_BYTES = 1 << 20


def host_empty(nbytes: int) -> np.ndarray:
    """An uninitialised ``uint8`` host buffer; from :data:`MAP_BYTES` on an anonymous memory map of its own, whose
    pages go back to the system when the last reference to it goes."""
    if nbytes < MAP_BYTES:
        return np.empty(nbytes, dtype=np.uint8)
    m = mmap.mmap(-1, nbytes) if _PRIVATE is None else mmap.mmap(-1, nbytes, flags=_PRIVATE)
    return np.frombuffer(m, dtype=np.uint8)


#: numpy advises the kernel to back arrays of this size and more with huge pages (``MADV_HUGEPAGE``)
NUMPY_HUGEPAGE_BYTES = 1 << 22


def heap_empty(nbytes: int) -> np.ndarray:
    """An uninitialised ``uint8`` buffer from the C heap, as torch allocates (``clone()``, ``torch.load``): a
    snapshot's copies and a restore's tensors.

    Not numpy's ``np.empty`` from 4 MiB on: numpy advises huge pages for those, and where the kernel's
    ``transparent_hugepage/defrag`` is ``madvise`` (the default of Ubuntu and Debian), each first touch of such a
    buffer may wait for the kernel to compact memory into a free huge page. On this VM, copying into a fresh
    10 MiB buffer took 12.9 ms at the median (1.3-16 ms) with numpy's advice and 2.2 ms without; the 10,000
    small tensors' group of a snapshot 27 ms against 7."""
    if nbytes >= NUMPY_HUGEPAGE_BYTES:
        torch = sys.modules.get("torch")
        if torch is not None:
            return torch.empty(nbytes, dtype=torch.uint8).numpy()  # type: ignore[no-any-return]
    return np.empty(nbytes, dtype=np.uint8)


def is_host_buffer(a: np.ndarray) -> bool:
    """Whether ``a`` is a whole buffer of :func:`host_empty` or :func:`heap_empty` (or numpy's own), not a view
    of other memory (a tensor's, a slice of a larger buffer)."""
    b: Any = a.base  # (numpy wraps the map in a memoryview; torch's numpy() has the tensor as its base)
    if b is None or isinstance(getattr(b, "obj", b), mmap.mmap):
        return True
    torch = sys.modules.get("torch")
    return (
        torch is not None
        and type(b) is torch.Tensor
        and b.dtype == torch.uint8
        and b.dim() == 1
        and b.numel() == a.nbytes
        and b.data_ptr() == a.ctypes.data
    )


_local = threading.local()


class _Buffers:
    """One thread's scratch buffers, by slot (held weakly by :data:`_every`: compared by identity)."""

    __slots__ = ("by_slot", "__weakref__")

    def __init__(self) -> None:
        self.by_slot: dict[str, np.ndarray] = {}


#: every thread's scratch buffers, for :func:`release_scratch`
_every: weakref.WeakSet[_Buffers] = weakref.WeakSet()
_lock = threading.Lock()


def scratch(slot: str, nbytes: int) -> np.ndarray:
    """This thread's reusable ``uint8`` buffer of ``slot``, at least ``nbytes`` long (a view of that length)."""
    held = getattr(_local, "scratch", None)
    if held is None:
        held = _Buffers()
        with _lock:
            _every.add(held)
        _local.scratch = held
    bufs = held.by_slot
    b = bufs.get(slot)
    if b is None or b.nbytes < nbytes:
        b = bufs[slot] = host_empty(max(nbytes, 1 << 16))
    return b[:nbytes]


def held_bytes() -> int:
    """The bytes every thread's scratch buffers hold now."""
    with _lock:
        every = list(_every)
    return sum(b.nbytes for h in every for b in list(h.by_slot.values()))


def release_scratch() -> None:
    """Drop every thread's scratch buffers. A thread using one meanwhile keeps it until it is done with it; its
    next call allocates again."""
    with _lock:
        every = list(_every)
    for held in every:
        held.by_slot = {}
