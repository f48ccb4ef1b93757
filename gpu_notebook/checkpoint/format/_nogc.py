"""``no_gc``: Python's cyclic collector off for a walk over every tensor of a state (no numpy: reading a manifest
uses it)."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["no_gc"]


@contextlib.contextmanager
def no_gc() -> Iterator[None]:
    """Python's cyclic collector off for a walk over every tensor of a state (a flatten, a restore's manifest and
    values): such a walk makes a few objects per tensor and frees none, so with the collector on a state of
    10,000 small tensors set off a full collection (a scan of every object of the process, up to twice the walk's
    own time) in one walk out of two. Nothing these walks make is cyclic garbage."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()
