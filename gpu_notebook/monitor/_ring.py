"""A bounded ring buffer of timestamped sample rows, readable incrementally by sequence number.

Each row is one tick of one node: a float vector with one column per (device, metric). Readers remember the
sequence number they got last and ask only for what is new (:meth:`RingBuffer.read_since`); if they fell so far
behind that rows were overwritten, the reply says how many were dropped.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from gpu_notebook.monitor._shapes import Rows

__all__ = ["RingBuffer"]


class RingBuffer:
    """Fixed-capacity storage of ``(time, row)`` pairs; the oldest rows are overwritten.

    Parameters
    ----------
    columns
        Column names; every appended row has this many values (NaN for "not available").
    capacity
        Maximum number of rows kept (e.g. ``rate_hz * 3600`` for an hour at full rate).
    """

    def __init__(self, columns: Sequence[str], capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.columns = list(columns)
        self.capacity = int(capacity)
        self._t = np.zeros(self.capacity, dtype=np.float64)
        self._data = np.full((self.capacity, len(self.columns)), np.nan, dtype=np.float64)
        self._seq = 0  # total rows ever appended
        self._lock = threading.Lock()

    @property
    def seq(self) -> int:
        """Total number of rows ever appended (the sequence number of the next row)."""
        return self._seq

    def __len__(self) -> int:
        return min(self._seq, self.capacity)

    def __repr__(self) -> str:
        return f"RingBuffer({len(self)}/{self.capacity} rows x {len(self.columns)} columns, seq={self._seq})"

    def append(self, t: float, row: Sequence[float] | np.ndarray) -> None:
        """Append one row taken at time ``t`` (seconds since the epoch)."""
        values = np.asarray(row, dtype=np.float64)
        if values.shape != (len(self.columns),):
            raise ValueError(f"row has shape {values.shape}, expected ({len(self.columns)},)")
        with self._lock:
            i = self._seq % self.capacity
            self._t[i] = t
            self._data[i] = values
            self._seq += 1

    def append_many(self, t: np.ndarray, rows: np.ndarray) -> None:
        """Append several rows at once (used by the aggregator): one vectorised copy, no per-row loop."""
        ts = np.asarray(t, dtype=np.float64).reshape(-1)
        values = np.asarray(rows, dtype=np.float64)
        if values.ndim != 2 or values.shape != (len(ts), len(self.columns)):
            raise ValueError(f"rows have shape {values.shape}, expected ({len(ts)}, {len(self.columns)})")
        n = len(ts)
        if n == 0:
            return
        with self._lock:
            skip = max(0, n - self.capacity)  # more rows than fit: only the newest capacity rows stay
            idx = (self._seq + np.arange(skip, n)) % self.capacity
            self._t[idx] = ts[skip:]
            self._data[idx] = values[skip:]
            self._seq += n

    def _slice(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        idx = np.arange(start, stop) % self.capacity
        return self._t[idx].copy(), self._data[idx].copy()

    def read_since(self, seq: int, max_rows: int | None = None) -> Rows:
        """Rows appended since sequence number ``seq``.

        Returns
        -------
        Rows
            ``seq`` (pass it next time), ``t`` (n,), ``data`` (n, columns), ``dropped`` (rows lost because
            they were overwritten before this read).
        """
        with self._lock:
            end = self._seq
            oldest = max(0, end - self.capacity)
            start = max(int(seq), oldest)
            dropped = max(0, oldest - int(seq))
            if max_rows is not None and end - start > max_rows:
                dropped += end - max_rows - start
                start = end - max_rows
            t, data = self._slice(start, end)
        return {"seq": end, "t": t, "data": data, "dropped": dropped}

    def window(self, since_t: float) -> tuple[np.ndarray, np.ndarray]:
        """All kept rows with time >= ``since_t``, oldest first (copies only those rows)."""
        with self._lock:
            end = self._seq
            start = max(0, end - self.capacity)
            idx = np.arange(start, end) % self.capacity
            t = self._t[idx]
            if len(t) and np.all(t[1:] >= t[:-1]):  # the normal case: times only grow
                k = int(np.searchsorted(t, since_t, side="left"))
                keep = idx[k:]
            else:  # the clock went backwards at some point: filter row by row
                keep = idx[t >= since_t]
            return self._t[keep].copy(), self._data[keep].copy()

    def oldest_t(self) -> float | None:
        """Time of the oldest kept row, or None when empty (no copy)."""
        with self._lock:
            if self._seq == 0:
                return None
            return float(self._t[max(0, self._seq - self.capacity) % self.capacity])

    def latest(self) -> tuple[float, np.ndarray] | None:
        """The newest row, or None when empty."""
        with self._lock:
            if self._seq == 0:
                return None
            i = (self._seq - 1) % self.capacity
            return float(self._t[i]), self._data[i].copy()

    def nbytes(self) -> int:
        """Memory held by the buffer."""
        return int(self._t.nbytes + self._data.nbytes)
