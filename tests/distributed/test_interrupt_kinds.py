"""Interrupts that keep worker state (issue 19, item 3): a cell blocked in ``time.sleep``, ``queue.get``,
``Event.wait``, ``future.result()``, ``Thread.join`` or a DataLoader's wait ends at the stop button, and the
workers keep their variables (no rebuild after the interrupt grace).

The pure part runs the sliced waits of ``_interruptible`` in a thread of this process and interrupts it as the
worker does (``PyThreadState_SetAsyncExc``); their results and timeouts are what the originals give. The journey
interrupts a ``%%distributed`` cell of each kind on the shared cluster with a kernel interrupt, as the stop button
does, and checks the variable set before it and the workers' pids.
"""

from __future__ import annotations

import _thread
import concurrent.futures
import ctypes
import multiprocessing
import queue
import sys
import threading
import time

import pytest
from _poll import wait_for

from gpu_notebook import _settings
from gpu_notebook.distributed import _interruptible

BLOCKING = {
    "time.sleep": "time.sleep(600)",
    "queue.get": "queue.Queue().get()",
    "Event.wait": "threading.Event().wait()",
    "future.result": "concurrent.futures.Future().result()",
    "Thread.join": "t = threading.Thread(target=time.sleep, args=(600,), daemon=True); t.start(); t.join()",
    "multiprocessing": "multiprocessing.get_context('spawn').Queue().get(timeout=600)",  # a DataLoader's wait
}


@pytest.fixture
def sliced():
    was = _interruptible.installed()
    _interruptible.install()
    yield
    if not was:
        _interruptible.uninstall()


def _interrupt(thread: threading.Thread) -> None:
    assert thread.ident is not None
    n = ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread.ident), ctypes.py_object(KeyboardInterrupt)
    )
    assert n == 1


# The sliced wait each kind blocks in. Waiting for that one, not any sliced wait: Thread.join's cell first waits in
# Thread.start for the new thread to run, and CPython 3.11 gives a thread state that is not running yet its
# creator's ident, so an interrupt sent then can land in the new thread's bootstrap instead of the cell.
WAITS_IN = {
    "time.sleep": "sleep",
    "queue.get": "condition_wait",
    "Event.wait": "condition_wait",
    "future.result": "condition_wait",
    "Thread.join": "thread_join",
    "multiprocessing": "mp_wait",
}


def _in_a_sliced_wait(thread: threading.Thread, kind: str) -> bool:
    """Whether ``thread`` is blocked in ``kind``'s sliced wait of ``_interruptible`` (where the interrupt must land)."""
    frame = sys._current_frames().get(thread.ident or 0)
    while frame is not None:
        if (
            frame.f_globals.get("__name__") == _interruptible.__name__
            and frame.f_code.co_name == WAITS_IN[kind]
        ):
            return True
        frame = frame.f_back
    return False


@pytest.mark.parametrize("kind", sorted(BLOCKING))
def test_each_blocking_wait_in_a_cell_thread_sees_the_interrupt(sliced, kind: str) -> None:
    got: list[BaseException] = []

    def cell() -> None:
        with _interruptible.cell_thread():
            try:
                exec(BLOCKING[kind], {"time": time, "queue": queue, "threading": threading,
                                      "concurrent": concurrent, "multiprocessing": multiprocessing})  # fmt: skip
            except BaseException as exc:  # noqa: BLE001 - what the interrupt raised
                got.append(exc)

    t = threading.Thread(target=cell, daemon=True)
    t.start()
    wait_for(
        lambda: _in_a_sliced_wait(t, kind) or not t.is_alive(), what=f"the cell thread to block in {kind}"
    )
    _interrupt(t)
    t.join(30)  # a 600 s wait: only the interrupt ends it
    assert not t.is_alive(), f"{kind}: the interrupt did not reach the blocked wait"
    assert len(got) == 1 and isinstance(got[0], KeyboardInterrupt), got


def test_sliced_waits_keep_their_results_and_timeouts(sliced) -> None:
    with _interruptible.cell_thread():
        q: queue.Queue[int] = queue.Queue()
        threading.Timer(0.2, q.put, (7,)).start()
        assert q.get() == 7  # a notify in the middle of a slice is not lost
        t0 = time.monotonic()
        with pytest.raises(queue.Empty):
            q.get(timeout=0.3)
        assert time.monotonic() - t0 >= 0.3
        ev = threading.Event()
        assert ev.wait(0.12) is False
        threading.Timer(0.1, ev.set).start()
        assert ev.wait(10) is True
        fut: concurrent.futures.Future[int] = concurrent.futures.Future()
        threading.Timer(0.1, fut.set_result, (3,)).start()
        assert fut.result() == 3
        with pytest.raises(concurrent.futures.TimeoutError):
            concurrent.futures.Future().result(timeout=0.2)
        t0 = time.monotonic()
        time.sleep(0.3)  # the call under test (the sliced sleep), not a wait
        assert time.monotonic() - t0 >= 0.3
        with pytest.raises(ValueError):
            time.sleep(-1)  # the call under test: the original's errors
        worker = threading.Thread(target=time.sleep, args=(0.2,))
        worker.start()
        worker.join()
        assert not worker.is_alive()
    # outside a cell the waits are the originals' own calls
    assert time.sleep is _interruptible.sleep and _interruptible._in_cell() is False


def test_the_switch_leaves_the_waits_alone(monkeypatch) -> None:
    was = _interruptible.installed()
    _interruptible.uninstall()
    try:
        monkeypatch.setenv(_settings.INTERRUPTIBLE_WAITS_VAR, "0")
        _interruptible.install()
        assert not _interruptible.installed() and time.sleep is _interruptible._sleep
    finally:
        monkeypatch.delenv(_settings.INTERRUPTIBLE_WAITS_VAR)
        if was:
            _interruptible.install()


# ---- the journey: %%distributed cells on the shared cluster, interrupted from the kernel ---------------------
CELL = {
    **{k: v for k, v in BLOCKING.items() if k != "multiprocessing"},
    "DataLoader": (
        "from torch.utils.data import DataLoader, Dataset\n"
        "class Slow(Dataset):\n"
        "    def __len__(self):\n"
        "        return 4\n"
        "    def __getitem__(self, i):\n"
        "        time.sleep(600)\n"
        "next(iter(DataLoader(Slow(), num_workers=1)))"
    ),
}


@pytest.mark.timeout(300)
def test_the_stop_button_ends_a_blocked_cell_of_each_kind_and_the_workers_keep_their_state(
    ip, shared, monkeypatch
) -> None:
    from IPython.utils.capture import capture_output

    assert (
        shared.timeouts.interrupt_grace <= 10
    )  # the default grace: a rank not stopping by then would be lost
    # A generous grace here: on CI's loaded 2-core machine a DataLoader cell's reply once came later than the
    # default 5 s (its worker process still starting). A wait the interrupt cannot reach still fails: it never
    # ends, so the group is rebuilt after the grace. benchmarks/interrupt.py measures the latency per kind.
    monkeypatch.setattr(shared.timeouts, "interrupt_grace", 60.0)
    with capture_output():
        assert ip.run_cell("%%distributed\nkeep = 'me'\n").success
    pids = [w.pid for w in shared.status().workers]
    for kind, code in CELL.items():
        timer = threading.Timer(2.0, _thread.interrupt_main)
        timer.start()
        with capture_output() as cap:
            res = ip.run_cell(
                "%%distributed\nimport concurrent.futures, queue, threading, time\n" + code + "\n"
            )
        timer.cancel()
        err = res.error_in_exec
        assert err is not None, (kind, cap.stdout)
        text = "\n".join(err._render_traceback_())
        assert text.startswith("Interrupted: the cell was stopped on 2 of 2 rank(s) (0-1)"), (kind, text)
        assert "still usable" in text and "rebuilt" not in text, (kind, text)
        with capture_output():
            res = ip.run_cell("%%distributed -o k\nkeep\n")
        assert res.success and list(ip.user_ns["k"]) == ["me", "me"], kind
        assert [w.pid for w in shared.status().workers] == pids, f"{kind}: the workers were replaced"


def test_a_forked_child_of_a_cell_thread_is_not_a_cell(sliced) -> None:
    import os

    r, w = os.pipe()
    with _interruptible.cell_thread():
        assert _interruptible._in_cell()
        pid = os.fork()
        if pid == 0:  # the child: same thread ident as the forking thread, but no cell
            os.write(w, b"1" if not _interruptible._in_cell() else b"0")
            os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(r, 1) == b"1"
    os.close(r)
    os.close(w)


def test_a_notify_as_a_slice_ends_is_never_lost(sliced, monkeypatch) -> None:
    """Future.result() waits once, with no recheck: a notify that came as one slice timed out was lost with sliced
    whole waits, and the cell waited forever (seen once under load). Tiny slices make that moment frequent."""
    monkeypatch.setattr(_interruptible, "SLICE_S", 0.0005)
    results: list[int] = []

    def cell() -> None:
        with _interruptible.cell_thread():
            for i in range(2000):
                fut: concurrent.futures.Future[int] = concurrent.futures.Future()
                threading.Timer(0.0005 * (i % 7), fut.set_result, (i,)).start()
                results.append(fut.result())

    t = threading.Thread(target=cell, daemon=True)
    t.start()
    t.join(120)  # a lost notify: result() never returns
    assert results == list(range(2000)), f"stuck after {len(results)} results"
