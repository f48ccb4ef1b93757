"""Progress reporting (bytes, speed) for long saves and restores.

``progress=None`` means "auto": in a Jupyter kernel, operations on more than ``min_bytes`` bytes show one
updating line (HTML with a text fallback); elsewhere nothing is shown. ``progress=False`` disables it; a
callable receives ``(label, done_bytes, total_bytes, elapsed_s)``.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from .._display import fmt_bytes

__all__ = ["Progress", "in_notebook"]

ProgressFn = Callable[[str, int, int, float], None]


def in_notebook() -> bool:
    """True inside a Jupyter kernel (a ZMQ-backed IPython shell)."""
    import sys

    if "IPython" not in sys.modules:
        return False
    from IPython import get_ipython

    ip = get_ipython()
    return ip is not None and type(ip).__name__ == "ZMQInteractiveShell"


def describe(label: str, done: int, total: int, elapsed: float) -> str:
    speed = done / elapsed if elapsed > 0 else 0.0
    pct = 100.0 * done / total if total else 100.0
    return f"{label}: {fmt_bytes(done)} / {fmt_bytes(total)} ({pct:.0f}%) at {fmt_bytes(speed)}/s, {elapsed:.1f} s"


class _NotebookLine:
    """One progress line in the notebook: displayed when created (so under the cell running then, also for work
    that goes on in background threads), then updated in place by its display id from any thread."""

    def __init__(self, label: str, total: int) -> None:
        self.display_id = f"gnb-ckpt-{uuid.uuid4().hex}"
        self.shown = False
        self(label, 0, total, 0.0)

    def __call__(self, label: str, done: int, total: int, elapsed: float) -> None:
        from IPython.display import display, update_display

        text = describe(label, done, total, elapsed)
        pct = 100.0 * done / total if total else 100.0
        bundle = {
            "text/plain": text,
            "text/html": (
                f'<div><progress value="{pct:.0f}" max="100" style="width:16em"></progress> '
                f"<span>{text}</span></div>"
            ),
        }
        if not self.shown:
            display(bundle, raw=True, display_id=self.display_id)
            self.shown = True
        else:
            update_display(bundle, raw=True, display_id=self.display_id)


class Progress:
    """Thread-safe byte counter that reports at most every ``interval_s`` seconds (and once at the end)."""

    def __init__(
        self,
        label: str,
        total: int,
        progress: bool | ProgressFn | None = None,
        min_bytes: int = 64 * 2**20,
        interval_s: float = 0.5,
    ) -> None:
        self.label = label
        self.total = int(total)
        self.done = 0
        self.t0 = time.perf_counter()
        self._last = 0.0
        self._lock = threading.Lock()
        self.interval_s = interval_s
        fn: Any = None
        if callable(progress):
            fn = progress
        elif progress is None and self.total >= min_bytes and in_notebook():
            fn = _NotebookLine(label, self.total)
        elif progress is True:
            fn = _NotebookLine(label, self.total) if in_notebook() else _print_line
        self._fn: ProgressFn | None = fn

    def restart(self) -> None:
        """Count again from 0 (the same line: a retried save)."""
        with self._lock:
            self.done = 0
            self.t0 = time.perf_counter()
            self._last = 0.0

    def add(self, n: int) -> None:
        if self._fn is None:
            return
        with self._lock:
            self.done += int(n)
            now = time.perf_counter()
            if now - self._last < self.interval_s:
                return
            self._last = now
            done = self.done
        self._fn(self.label, done, self.total, now - self.t0)

    def finish(self) -> None:
        if self._fn is None:
            return
        with self._lock:
            self.done = max(self.done, self.total)
        self._fn(self.label, self.done, self.total, time.perf_counter() - self.t0)


def _print_line(label: str, done: int, total: int, elapsed: float) -> None:
    print(describe(label, done, total, elapsed), flush=True)
