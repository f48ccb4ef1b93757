"""A rank waiting, in a cell on some ranks only, for ranks that are not running that cell (rank side).

The collectives of ``torch.distributed`` check their group before they start in such a cell
(:func:`._process_group.cell_ranks`), but a collective issued from C++ never passes through them:
DistributedDataParallel's gradient all-reduce inside ``backward()``, FSDP's gathers, a compiled or custom op. On
the default group it then waits for the ranks outside the cell until the collective timeout (30 minutes by
default), and the notebook would only see a silent cell.

:class:`OutsideWaitWatch` notices it while it happens: a thread of the rank reads the default group's sequence
number (it counts every collective this rank has issued, C++ ones included) every half second. When it has grown
since the cell started and the cell's thread has stayed on the same bytecode for :data:`STILL_S` seconds taking
almost no CPU (so it is blocked in C, not computing between two operations), it writes one message into the rank's output, which the
notebook shows at once: which ranks it waits for, on which line of the cell, and what to do. Point-to-point
operations between the cell's own ranks also move the number (with gloo), but they end, so they are not reported.
"""

from __future__ import annotations

import linecache
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from gpu_notebook._display import rank_label

__all__ = ["OutsideWaitWatch", "STILL_S", "POLL_S"]

POLL_S = 0.5  # how often the sequence number and the cell's frame are read
STILL_S = 3.0  # how long the cell's thread must stay on one bytecode after a new collective to be reported

_SKIP = ("site-packages", "dist-packages", os.sep + "lib" + os.sep + "python")
_OURS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cell_line(frame: Any) -> str:
    """Where in the user's code ``frame`` (a thread's innermost frame) is: the innermost frame outside
    installed packages and ours, as ``line N: `code```; "" when there is none."""
    f = frame
    while f is not None:
        name = f.f_code.co_filename
        path = name if name.startswith("<") else os.path.abspath(name)
        if not path.startswith(_OURS) and not any(s in path for s in _SKIP):
            code = linecache.getline(name, f.f_lineno).strip()
            return f"line {f.f_lineno}" + (f": `{code}`" if code else "")
        f = f.f_back
    return ""


def message(
    rank: int, cell_ranks: Sequence[int], missing: Sequence[int], where: str, timeout_s: float
) -> str:
    """What the rank says once it is seen waiting for ``missing``."""
    minutes = timeout_s / 60
    wait = f"{minutes:g} min" if minutes >= 1 else f"{timeout_s:g} s"
    them = "it" if len(missing) == 1 else "them"
    return (
        f"gpu_notebook: rank {rank} is waiting in a collective on the default group, which needs "
        f"{rank_label(missing)}, not running this cell (it runs on {rank_label(cell_ranks)})"
        f"{f', at {where}' if where else ''}. The collective was issued from C++ (DistributedDataParallel's "
        f"gradient all-reduce in backward(), FSDP, a compiled op), which the check of dist.* calls cannot stop "
        f"before it starts. It waits for {them} until the collective timeout ({wait}). The stop button "
        f"interrupts the cell, but a rank blocked in a collective does not stop, so the worker group is rebuilt "
        f"and every worker's state is lost. Run such a cell on every rank, or give the model a group of this "
        f"cell's ranks (dist.new_group([...]) in a cell on every rank).\n"
    )


def _thread_clock(thread_id: int) -> int | None:
    """The CPU-time clock of thread ``thread_id`` (None where the platform has none, e.g. macOS)."""
    try:
        return time.pthread_getcpuclockid(thread_id)
    except (AttributeError, OSError, OverflowError):
        return None


def _cpu(clock: int | None) -> float:
    if clock is None:
        return 0.0
    try:
        return time.clock_gettime(clock)
    except OSError:  # the thread ended
        return 0.0


class OutsideWaitWatch:
    """Watches the thread running a cell on ``cell_ranks`` only, while the default group also has ``missing``.

    Args:
        seq: the default group's sequence number now (None: no group).
        thread_id: the ident of the thread running the cell.
        rank, cell_ranks, missing: this rank, the cell's ranks, the group's ranks outside the cell.
        timeout_s: the group's collective timeout (said in the message).
        write: where the message goes (the rank's captured stderr).
    """

    def __init__(
        self,
        seq: Callable[[], int | None],
        thread_id: int,
        rank: int,
        cell_ranks: Sequence[int],
        missing: Sequence[int],
        timeout_s: float,
        write: Callable[[str], Any],
        poll_s: float = POLL_S,
        still_s: float = STILL_S,
    ) -> None:
        self.seq, self.thread_id, self.rank = seq, thread_id, rank
        self.cell_ranks, self.missing = list(cell_ranks), list(missing)
        self.timeout_s, self.write = timeout_s, write
        self.poll_s, self.still_s = poll_s, still_s
        self.reported = False
        self._stop = threading.Event()
        self._start_seq = seq()
        self._thread = threading.Thread(target=self._run, name="gpu-notebook-outside-wait", daemon=True)

    def start(self) -> OutsideWaitWatch:
        if self._start_seq is not None:
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        start = self._start_seq
        assert start is not None
        clock = _thread_clock(self.thread_id)
        last: tuple[int, int, int] | None = None
        still_since = cpu_since = 0.0
        while not self._stop.wait(self.poll_s):
            now = self.seq()
            frame = sys._current_frames().get(self.thread_id)
            if now is None or frame is None:
                return  # the group or the cell's thread is gone
            if now <= start:
                last = None
                continue
            where = (id(frame.f_code), frame.f_lasti, now)
            cpu = _cpu(clock)
            if where != last:
                last, still_since, cpu_since = where, time.monotonic(), cpu
                continue
            waited = time.monotonic() - still_since
            # a Python loop is seen at one bytecode too (threads switch at its backward jump): a waiting
            # thread also takes (almost) no CPU
            if cpu - cpu_since > 0.2 * waited:
                last = None
                continue
            if waited >= self.still_s and not self._stop.is_set():
                self.reported = True
                self.write(
                    message(self.rank, self.cell_ranks, self.missing, cell_line(frame), self.timeout_s)
                )
                return
