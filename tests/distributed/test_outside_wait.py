"""A collective issued from C++ in a cell on some ranks only is reported while it waits (``_outside_wait``).

These drive :class:`OutsideWaitWatch` with a sequence number they set and a thread they block or keep busy. The
real case, DDP's ``backward()`` in a background cell on rank 0 of two real workers, is in
tests/distributed/test_background_cells.py (``test_stopping_the_cluster_ends_its_background_cell``).
"""

from __future__ import annotations

import threading
import time

from _poll import wait_for

from gpu_notebook.distributed._outside_wait import OutsideWaitWatch, cell_line, message


def _blocked_thread(seconds: float) -> threading.Thread:
    t = threading.Thread(target=time.sleep, args=(seconds,), daemon=True)
    t.start()
    return t


STILL_S = 0.3


def _watch(seq: list[int], thread: threading.Thread, out: list[str], polls: list[float]) -> OutsideWaitWatch:
    """A watch of ``thread`` reading ``seq[0]``; ``polls`` gets the time of each of its readings."""
    assert thread.ident is not None

    def read() -> int:
        polls.append(time.monotonic())
        return seq[0]

    return OutsideWaitWatch(
        read, thread.ident, 0, [0], [1], 1800.0, out.append, poll_s=0.05, still_s=STILL_S
    ).start()


def _looked_for(polls: list[float], seconds: float) -> bool:
    """Whether the watch has polled for ``seconds`` and then once more: whatever it was to report in that time, it
    has written by now (``polls[0]`` is the reading at its creation)."""
    return len(polls) >= 3 and polls[-2] - polls[1] >= seconds


def test_a_new_collective_with_the_thread_blocked_is_reported_once():
    seq, out, polls = [7], [], []
    thread = _blocked_thread(30)
    w = _watch(seq, thread, out, polls)
    wait_for(lambda: _looked_for(polls, 2 * STILL_S), what="the watch to look at the blocked thread")
    assert not out  # no collective since the cell started: nothing to say
    seq[0] = 8
    deadline = time.monotonic() + 20
    while not out and time.monotonic() < deadline:
        time.sleep(0.05)
    w.stop()
    assert len(out) == 1 and w.reported
    assert "rank 0 is waiting in a collective on the default group, which needs rank 1" in out[0]
    assert "(30 min)" in out[0] and "dist.new_group" in out[0]


def test_a_thread_that_goes_on_running_python_is_not_reported():
    seq, out, polls = [1], [], []
    stop = threading.Event()

    def busy() -> None:  # point-to-point done, then computing in Python: its bytecode keeps moving
        x = 0
        while not stop.is_set():
            x += 1

    t = threading.Thread(target=busy, daemon=True)
    t.start()
    w = _watch(seq, t, out, polls)
    seq[0] = 2
    wait_for(lambda: _looked_for(polls, 5 * STILL_S), what="the watch to look at the busy thread")
    w.stop()
    stop.set()
    assert not out


def test_the_message_names_the_ranks_the_line_and_the_timeout():
    text = message(2, [2, 3], [0, 1], "line 4: `loss.backward()`", 90)
    assert "rank 2 is waiting" in text and "needs ranks 0-1, not running this cell" in text
    assert "it runs on ranks 2-3" in text and "at line 4: `loss.backward()`" in text and "(1.5 min)" in text

    def here():
        return cell_line(__import__("sys")._getframe())

    assert here().startswith("line ")  # this test file is the user's code here
