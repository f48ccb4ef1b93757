"""Per-thread scratch buffers of the codec, and their release between saves.

Each thread that encodes or decodes chunks keeps a few chunk-sized ``uint8`` buffers (the transformed chunk, its
byte planes, a permutation), reused chunk after chunk: a fresh allocation page-faults, which is slow on some
hosts. Between saves they would hold about ``threads x 4 x chunk`` bytes, so a save's job drops them all when it
has ended (:func:`release_scratch`); the next save allocates them again.
"""

from __future__ import annotations

import threading
import weakref

import numpy as np

__all__ = ["scratch", "release_scratch"]

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
        b = bufs[slot] = np.empty(max(nbytes, 1 << 16), dtype=np.uint8)
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
