"""The copies of a snapshot, made on a thread of their own while the walk of the state goes on.

A snapshot walks the state (``state_dict()`` calls, names, a leaf per tensor: about 6 us per tensor in Python)
and copies each tensor into host memory. Made one after the other, the walk adds to the copies: on the benchmark's
40 MB state the training stall was 1.2-1.3x a plain host copy (``clone()`` of every tensor after the same training
step), 1.2x on 155 MB. The walk hands the copies to a thread in batches of a few MB (the copy releases the GIL), so
that they run while it goes on, and waits for them at its end: 1.03-1.1x and 0.8x (A/B, interleaved; see
``benchmarks/checkpoint.py``'s memory table).

One thread for the process (started on the first snapshot; idle between saves): a copy uses torch's intra-op
threads as ``clone()`` does. Snapshots taken at the same time from several threads share it, each waiting for its
own copies.
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
from typing import Any

__all__ = ["Copies"]

#: the walk hands its copies over once this many bytes are waiting (smaller batches start sooner and cost more in
#: hand-overs: 1, 2, 4 and 8 MB measured 1.18x, 1.12x, 1.03-1.12x and 1.08x of the host copy on 40 MB)
BATCH_BYTES = 4 << 20

_pool: cf.ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _copy_pool() -> cf.ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="gnb-ckpt-copy")
        return _pool


def _copy_all(pairs: list[tuple[Any, Any]]) -> None:
    for dst, src in pairs:
        dst.copy_(src)


class Copies:
    """The copies of one snapshot: :meth:`add` queues one (``dst.copy_(src)``), :meth:`finish` waits for all of
    them and raises the first failure. The caller keeps ``src`` unchanged until :meth:`finish` returns (a save
    returns only then)."""

    def __init__(self, batch_bytes: int = BATCH_BYTES) -> None:
        self.batch_bytes = batch_bytes
        self._batch: list[tuple[Any, Any]] = []
        self._n = 0
        self._futures: list[cf.Future[None]] = []

    def add(self, dst: Any, src: Any, nbytes: int) -> None:
        self._batch.append((dst, src))
        self._n += nbytes
        if self._n >= self.batch_bytes:
            self._hand_over()

    def _hand_over(self) -> None:
        if self._batch:
            batch, self._batch, self._n = self._batch, [], 0
            self._futures.append(_copy_pool().submit(_copy_all, batch))

    def finish(self) -> None:
        """Hand over the last batch and wait until every copy is made (all of them, even after a failure: no copy
        may still be writing once the snapshot is dropped)."""
        self._hand_over()
        futures, self._futures = self._futures, []
        cf.wait(futures)
        for f in futures:
            f.result()
