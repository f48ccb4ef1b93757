"""Ray's own notice that a rank's worker died, kept out of the notebook when the cell's error already says it.

When a worker process ends unexpectedly, the raylet sends the driver "A worker died or was killed while executing
a task by an unexpected system error ... Worker PID: N ... Some common causes include: (1) the process was killed
by the OOM killer ...", and Ray's listener thread prints it on the notebook's stdout as ``(raylet) ...``, whenever
it arrives: in the failing cell or in a later one. For a rank that was running a cell, that cell's error already
names the rank that died, its pid, its node, its last output and a fatal signal, so Ray's list of guesses only
misleads (a deliberate kill, a preemption, reads like an out-of-memory kill). Only that notice, and only for the
pids of ranks running a cell (or that ran one in the last :data:`GRACE_S` seconds: the notice comes through Ray's
pubsub in its own time), is dropped; every other message Ray prints (a task its memory monitor killed, a worker of
the user's own tasks) is printed as before.
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["GRACE_S", "deaths_reported_by_the_cell", "is_reported_death"]

#: how long after its cell a rank's death notice is still that cell's to report
GRACE_S = 60.0
_DIED = re.compile(
    r"A worker died or was killed while executing a task by an unexpected system error\b.*?\bWorker PID: (\d+)",
    re.S,
)
_lock = threading.Lock()
_covered: dict[int, float] = {}  # pid -> until when (time.monotonic()), inf while its cell runs
_installed = False


@contextmanager
def deaths_reported_by_the_cell(pids: Iterable[int | None]) -> Iterator[None]:
    """While a cell runs on the ranks with ``pids`` (and :data:`GRACE_S` after), Ray's death notices for them
    are not printed: the cell's error reports a death."""
    mine = [p for p in pids if isinstance(p, int) and p > 0]
    _install()
    with _lock:
        for pid in mine:
            _covered[pid] = math.inf
    try:
        yield
    finally:
        now = time.monotonic()
        with _lock:
            for pid in [p for p, until in _covered.items() if until < now]:
                del _covered[pid]
            for pid in mine:
                _covered[pid] = now + GRACE_S


def is_reported_death(data: dict[str, Any]) -> bool:
    """Whether ``data`` (what Ray's listener prints) is the raylet's notice of a death a cell reports."""
    if data.get("pid") != "raylet":
        return False
    lines = data.get("lines") or []
    now = time.monotonic()
    with _lock:
        for line in lines:
            m = _DIED.search(str(line))
            if m is None or _covered.get(int(m.group(1)), -math.inf) < now:
                return False
    return bool(lines)


def _install() -> None:
    """Wrap Ray's printer of the driver's messages once (its listener thread looks the function up per call)."""
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
    try:
        from ray._private import worker as ray_worker
    except ImportError:  # pragma: no cover - Ray is what runs the ranks
        return
    original = getattr(ray_worker, "print_to_stdstream", None)
    if original is None:  # another Ray: its notices are printed as they are
        return

    def print_to_stdstream(data: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(data, dict) and is_reported_death(data):
            return None
        return original(data, *args, **kwargs)

    print_to_stdstream.__wrapped__ = original  # type: ignore[attr-defined]
    ray_worker.print_to_stdstream = print_to_stdstream
