"""Blocking waits in a cell that the stop button can end: sleeps and lock waits cut into short slices.

A cell runs on a thread of the rank's process (a Ray concurrency group), not on its main thread, and the stop
button reaches it as an exception raised in that thread (``PyThreadState_SetAsyncExc``). CPython delivers such an
exception only between bytecodes: a thread blocked in one C call (``time.sleep(600)``, ``queue.get()`` on an empty
queue, ``future.result()``, ``Event.wait()``, a DataLoader waiting for its workers) would not see it until the call
returned, and after the interrupt grace the whole group was rebuilt, every worker's state lost.

A real SIGINT would not help: CPython runs signal handlers only on the main thread, and the main thread of a Ray
worker sits in Ray's C++ task loop, never running Python; moving the cells there would also block the control
calls (output, stacks, the interrupt itself) that run beside a cell. Instead, on the thread running a cell only,
the waits that end in one C call are made of short ones (:data:`SLICE_S`): ``time.sleep``,
``threading.Condition.wait`` (which ``queue.Queue.get``, ``Event.wait``, ``Future.result``, ``Semaphore`` and
``Barrier`` use), ``threading.Thread.join`` and ``multiprocessing.connection.wait`` (what a DataLoader's wait
for its workers and a ``multiprocessing.Queue.get`` with a timeout block in). Between two slices the interrupt
is delivered; each slice costs a wake-up every 50 ms, on that thread only. Other threads (Ray's, a DataLoader's
own) wait as before.

What this cannot reach: a wait inside C or C++ code that never returns to Python (a gloo or NCCL collective: it
ends at torch.distributed's timeout, or through the group's rebuild), a blocking socket read with no timeout, a
``multiprocessing.Queue.get()`` with no timeout (a blocking pipe read).
"""

from __future__ import annotations

import _thread
import math
import multiprocessing.connection
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from gpu_notebook import _settings

__all__ = ["SLICE_S", "cell_thread", "install", "installed", "release_later", "uninstall"]

SLICE_S = 0.05

_cells: set[int] = set()  # threads running a cell now
_lock = threading.Lock()
_installed = False

_sleep = time.sleep
_cond_wait = threading.Condition.wait
_join = threading.Thread.join
_mp_wait = multiprocessing.connection.wait


class cell_thread:  # noqa: N801 - a context manager used like a function
    """``with cell_thread():`` the waits of the current thread are sliced while the cell runs."""

    def __enter__(self) -> None:
        self.tid = threading.get_ident()
        with _lock:
            _cells.add(self.tid)

    def __exit__(self, *exc: Any) -> None:
        with _lock:
            _cells.discard(self.tid)


def _forked() -> None:
    """A forked child (a DataLoader worker) is no cell: its thread may carry the forking cell thread's ident."""
    global _lock
    _lock = threading.Lock()
    _cells.clear()


os.register_at_fork(after_in_child=_forked)


def _in_cell() -> bool:
    return threading.get_ident() in _cells


def _sliced(wait: Callable[[float], Any], timeout: float | None, done: Callable[[Any], bool]) -> Any:
    """Call ``wait(slice)`` until ``done(result)`` or ``timeout`` seconds passed; the last result."""
    end = None if timeout is None else time.monotonic() + max(0.0, timeout)
    while True:
        left = SLICE_S if end is None else min(SLICE_S, max(0.0, end - time.monotonic()))
        got = wait(left)
        if done(got) or (end is not None and time.monotonic() >= end):
            return got


def _short(timeout: float | None) -> bool:
    """A wait that ends soon (or an argument the original must judge): left to the original."""
    if timeout is None:
        return False
    try:
        t = float(timeout)
    except (TypeError, ValueError):
        return True
    return not math.isfinite(t) or t <= SLICE_S


def sleep(secs: float) -> None:
    if not _in_cell() or _short(secs):
        return _sleep(secs)
    end = time.monotonic() + float(secs)
    while (left := end - time.monotonic()) > 0:
        _sleep(min(left, SLICE_S))
    return None


def condition_wait(self: threading.Condition, timeout: float | None = None) -> bool:
    if not _in_cell() or _short(timeout) or not self._is_owned():  # type: ignore[attr-defined]
        return _cond_wait(self, timeout)  # (un-acquired: the original raises its own RuntimeError)
    # Condition.wait itself, with its one blocking acquire cut into slices. The waiter stays registered for the whole
    # wait: slicing whole waits instead lost a notify that came as a slice timed out, and Future.result() (one
    # wait(None), no recheck) then waited forever.
    waiter = _thread.allocate_lock()
    waiter.acquire()
    self._waiters.append(waiter)  # type: ignore[attr-defined]
    saved_state = self._release_save()  # type: ignore[attr-defined]
    gotit = False
    try:
        gotit = bool(_sliced(lambda s: waiter.acquire(True, s), timeout, bool))
        return gotit
    finally:
        self._acquire_restore(saved_state)  # type: ignore[attr-defined]
        if not gotit:
            try:
                self._waiters.remove(waiter)  # type: ignore[attr-defined]
            except ValueError:
                pass


def thread_join(self: threading.Thread, timeout: float | None = None) -> None:
    if not _in_cell() or _short(timeout) or self is threading.current_thread():
        return _join(self, timeout)
    _sliced(lambda s: _join(self, s), timeout, lambda _: not self.is_alive())
    return None


def mp_wait(object_list: Any, timeout: float | None = None) -> list[Any]:
    if not _in_cell() or _short(timeout):
        return _mp_wait(object_list, timeout)
    return list(_sliced(lambda s: _mp_wait(object_list, s), timeout, bool))


_graveyard: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
_reaper: threading.Thread | None = None


def release_later(*objs: Any) -> None:
    """Drop ``objs`` (an interrupted cell's exception, whose traceback holds the cell's frames) on a thread of
    their own: what their finalisers do (a DataLoader iterator joins its workers for up to 5 s) must not delay
    the cell's reply past the interrupt grace."""
    global _reaper
    with _lock:
        if _reaper is None or not _reaper.is_alive():
            _reaper = threading.Thread(target=_reap, daemon=True, name="gpu_notebook-release")
            _reaper.start()
    _graveyard.put(objs)


def _reap() -> None:
    while True:
        item = _graveyard.get()
        del item


def _patches() -> tuple[tuple[Any, str, Any, Any], ...]:
    """(owner, attribute, sliced version, original) of every wait this module replaces."""
    return (
        (time, "sleep", sleep, _sleep),
        (threading.Condition, "wait", condition_wait, _cond_wait),
        (threading.Thread, "join", thread_join, _join),
        (multiprocessing.connection, "wait", mp_wait, _mp_wait),
    )


def install() -> None:
    """Patch the waits (once per process; they behave as before on every thread but a cell's), unless
    ``$GPU_NOTEBOOK_INTERRUPTIBLE_WAITS`` is ``0``."""
    global _installed
    if not _settings.interruptible_waits():
        return
    with _lock:
        if not _installed:
            for owner, name, sliced, _ in _patches():
                setattr(owner, name, sliced)
            _installed = True


def uninstall() -> None:
    """Put the original waits back (tests)."""
    global _installed
    with _lock:
        for owner, name, _, original in _patches():
            setattr(owner, name, original)
        _installed = False


def installed() -> bool:
    return _installed
