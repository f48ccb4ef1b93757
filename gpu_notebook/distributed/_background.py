"""Background cells: a cell that runs on the ranks while the notebook runs other cells.

``%%distributed --noblock`` and ``Cluster.run(..., block=False)`` hand the worker group's ordinary blocking run
to a thread of the kernel and return a :class:`BackgroundCell` at once (ipyparallel's ``AsyncResult`` is the
model: ``ready``, ``wait``, ``get``, ``progress``, ``cancel``). The group's run is the same code as a blocking
cell's (streaming, failure reports, recovery); only the waiting moves to a thread.

Where the output goes: in a Jupyter kernel the handle is shown as a display with a ``display_id`` and every
update (output lines, per-rank state, elapsed time) is an ``update_display_data`` for that id, which frontends
apply to the cell that started the run whichever cell runs now (plain ``print`` from a thread would land in the
cell running at the moment of the write). Outside a kernel (a terminal, a script) lines are written to stdout as
a blocking cell writes them. Rich output from the ranks (``display()``, figures; see :mod:`._rich`) is kept in
the handle (the last :data:`KEPT_DISPLAYS`) and shown in the live view, or published at once outside a kernel.
The thread runs in a copy of the starting cell's context (``--output-ranks`` holds in it). The handle keeps the last :data:`KEPT_LINES` lines; the group's per-rank log keeps
what ``%gpu_cluster logs`` shows.

Only one cell runs on a group at a time: a second one is refused (:class:`BusyError`) naming the running one and
how to wait for it or cancel it. ``push``/``pull`` stay allowed (they run in the workers' control threads). The
kernel stop button does not reach a background cell (it interrupts the cell running in the foreground):
``cancel()`` interrupts its ranks as the stop button interrupts a blocking cell's, and the workers keep their
state. Stopping the cluster ends a background cell as "cluster stopped"; at interpreter exit every background
cell is cancelled.
"""

from __future__ import annotations

import atexit
import contextvars
import html
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any

from gpu_notebook import _registry
from gpu_notebook._display import fmt_duration, format_ranks
from gpu_notebook.distributed import _debug, _rich
from gpu_notebook.distributed._results import CellResult, RankResults
from gpu_notebook.errors import GpuNotebookError

__all__ = ["BackgroundCell", "BusyError", "find", "refuse_second", "running_on"]

#: lines of output a background cell's handle keeps (the live view shows the last :data:`VIEW_LINES`)
KEPT_LINES = 2000
VIEW_LINES = 40
#: rich outputs (displays, figures) from the ranks a background cell's handle keeps and its view shows
KEPT_DISPLAYS = 20
#: how often the live view is refreshed while output arrives, and at most how long it goes without a refresh
REFRESH_S = 0.25
IDLE_REFRESH_S = 2.0


class BusyError(GpuNotebookError, RuntimeError):
    """A cell was sent to workers that are running a background cell (the message says how to wait or cancel)."""


class WaitTimeout(GpuNotebookError, TimeoutError):
    """``get(timeout)`` or ``wait`` ran out of time while the background cell still runs."""


# every background cell of this kernel, oldest first (for %gpu_result NAME), lives in _registry.background_cells
_KEEP = 20  # finished ones kept for %gpu_result


class BackgroundCell:
    """One cell running in the background; see the module docstring.

    ``start(write)`` runs the cell (the group's blocking run), sending output text to ``write``; it is called
    in a thread of its own. ``live``: show and update a display in the cell that started it (a Jupyter
    kernel); else output goes to stdout. ``on_done(cell)`` runs in that thread once the cell has ended.
    """

    def __init__(
        self,
        name: str,
        group: Any,
        ranks: list[int],
        world_size: int,
        start: Callable[[Callable[[str], None]], CellResult],
        *,
        live: bool = False,
        sink: Callable[[str], None] | None = None,
        on_done: Callable[[BackgroundCell], None] | None = None,
        followed: bool = False,
    ) -> None:
        self.name = name
        #: started by a kernel that is gone, followed here since an attach: ``%gpu_result`` prints its output
        self.followed = followed
        self._count = 0  # complete lines written so far (the kept ones are the last of them)
        self.group = group
        self.ranks = list(ranks)
        self.world_size = world_size
        self.live = live
        self.display_id = f"gpu-notebook-bg-{uuid.uuid4().hex[:12]}"
        self.started = time.time()
        self.ended: float | None = None
        self.result: CellResult | None = None
        self.error: BaseException | None = None  # the run itself failed (GroupError, Ray gone)
        self.cancelled = False
        self._sink = sink
        self._on_done = on_done
        self._lines: deque[str] = deque(maxlen=KEPT_LINES)
        self.displays: deque[dict[str, Any]] = deque(maxlen=KEPT_DISPLAYS)  # rich output from the ranks
        self._partial = ""
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._dirty = threading.Event()
        self._shown = False
        self._run: Any = None  # the group's CellRun while this cell runs (per-rank state, cancel)
        ctx = contextvars.copy_context()  # the starting cell's settings (--output-ranks) hold in the thread
        self._thread = threading.Thread(
            target=ctx.run, args=(self._main, start), name=f"gpu_notebook background cell {name}", daemon=True
        )
        _registry.background_cells.add(self, keep=_KEEP)
        self._thread.start()
        if live:
            threading.Thread(target=self._refresher, name=f"{self._thread.name} view", daemon=True).start()

    # ---- the run -----------------------------------------------------------------------------------------------
    def _main(self, start: Callable[[Callable[[str], None]], CellResult]) -> None:
        try:
            _debug.PROMPT.set(False)  # a rank that pauses waits for %gpu_debug: this thread has no input box
            with _rich.publishing_to(self._display):
                self.result = start(self._write)
            filt = _rich.current_filter()
            if filt is not None and filt.note():
                self._write(filt.note() + "\n")
        except BaseException as exc:  # noqa: BLE001 - kept for get(): the run could not happen (group, Ray)
            self.error = exc
        finally:
            self.ended = time.time()
            self._done.set()
            if self._on_done is not None:
                try:
                    self._on_done(self)
                except Exception as exc:  # noqa: BLE001 - a binding that fails must not hide the result
                    self._write(f"gpu_notebook: could not store the result: {exc}\n")
            self._dirty.set()

    def _write(self, text: str) -> None:
        """Output from the ranks (prefixed lines) or the run's progress notes."""
        if not text:
            return
        with self._lock:
            parts = (self._partial + text).split("\n")
            self._partial = parts.pop()
            self._lines.extend(parts)
            self._count += len(parts)
        self._dirty.set()
        if not self.live:
            (self._sink or _stdout)(text)

    def _display(self, bundle: dict[str, Any]) -> None:
        """Rich output from a rank: kept for the view (a live one shows it); outside a kernel, shown now."""
        with self._lock:
            self.displays.append(bundle)
        self._dirty.set()
        if self.live:
            return
        if _rich._shell() is None:  # no IPython: its text
            self._write(str(bundle["data"].get("text/plain", _rich.summary(bundle))) + "\n")
            return
        from IPython.display import publish_display_data

        publish_display_data(bundle["data"], bundle.get("metadata") or None)

    def _current_run(self) -> Any:
        """The group's record of this cell's run, once the group has started it."""
        if self._run is None and not self._done.is_set():
            self._run = getattr(self.group, "current_run", None)
        return self._run

    # ---- the handle ------------------------------------------------------------------------------------------
    def ready(self) -> bool:
        """Whether the cell has ended on every rank."""
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds (None: until it ends); whether it has ended."""
        return self._done.wait(timeout)

    def get(self, timeout: float | None = None) -> RankResults:
        """The per-rank values of the cell's last expression, once it ended (waits up to ``timeout``).

        Raises the cell's :class:`~gpu_notebook.distributed.DistributedError` when a rank failed, as a blocking
        cell does, and :class:`WaitTimeout` when it still runs after ``timeout``.
        """
        if not self.wait(timeout):
            raise WaitTimeout(f"background cell {self.name} still runs after {timeout:g} s")
        if self.error is not None:
            raise self.error
        assert self.result is not None
        self.result.raise_for_failures(self.world_size)
        return self.result.values

    @property
    def elapsed(self) -> float:
        """Seconds since it started (to its end once it ended)."""
        return (self.ended or time.time()) - self.started

    @property
    def _elapsed_text(self) -> str:
        return fmt_duration(self.elapsed, minutes=True)

    @property
    def progress(self) -> int:
        """How many of its ranks have ended the cell."""
        return sum(state != "running" for state in self.rank_states().values())

    @property
    def state(self) -> str:
        """running, done, failed, cancelled or stopped."""
        if not self._done.is_set():
            return "running"
        if self.result is None:
            return "failed"
        if any(f.kind == "stopped" for f in self.result.failures):
            return "stopped"
        if self.cancelled:
            return "cancelled"
        return "failed" if self.result.failures else "done"

    def rank_states(self) -> dict[int, str]:
        """Each rank's state: running, in the debugger, done, failed (or interrupted), cancelled or stopped."""
        if self._done.is_set():
            if self.result is None:
                return dict.fromkeys(self.ranks, "failed")
            failed = {f.rank: f.kind for f in self.result.failures}
            return {
                r: _failed_state(failed[r], self.cancelled) if r in failed else "done" for r in self.ranks
            }
        run = self._current_run()
        if run is None:
            return dict.fromkeys(self.ranks, "running")
        pending = set(run.pending.values())
        out = {}
        for r in self.ranks:
            if r in run.failures:
                out[r] = "failed"
            elif run.streamer.debugger.get(r) and r in pending:
                out[r] = "in the debugger"
            elif r in pending or r not in run.values:
                out[r] = "interrupting" if run.interrupted_at is not None else "running"
            else:
                out[r] = "done"
        return out

    def cancel(self, timeout: float = 2.0) -> bool:
        """Interrupt its running ranks, as the stop button interrupts a blocking cell's (the workers keep their
        state; ranks that do not stop within the group's interrupt grace are rebuilt). Whether it was running."""
        if self._done.is_set():
            return False
        self.cancelled = True
        deadline = time.monotonic() + timeout
        run = self._current_run()
        while run is None and not self._done.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)  # the thread has not submitted the cell yet
            run = self._current_run()
        if run is None:
            return not self._done.is_set()
        if run.interrupted_at is None:
            run.interrupt_reason = "interrupted"
            run.interrupted_at = time.monotonic()
            self.group._interrupt(list(run.pending.values()), run.workers)
        return True

    def output(self, tail: int | None = None) -> list[str]:
        """The last lines it printed (those kept: :data:`KEPT_LINES`), prefixed ``[rank N]``."""
        with self._lock:
            lines = list(self._lines) + ([self._partial] if self._partial else [])
        return lines[-tail:] if tail else lines

    def lines_since(self, seen: int) -> tuple[list[str], int]:
        """The complete lines written after the first ``seen`` (those still kept), and how many there are now."""
        with self._lock:
            new = min(self._count - seen, len(self._lines))
            return (list(self._lines)[len(self._lines) - new :] if new > 0 else []), self._count

    def busy_message(self, doing: str = "running another cell") -> str:
        """Why a second cell is refused while this one runs, and what to do."""
        return (
            f"background cell {self.name} is running on ranks {format_ranks(self.ranks)} "
            f"(for {self._elapsed_text}, {self.progress}/{len(self.ranks)} ranks done): {doing} now would "
            f"queue behind it. Wait for it with %gpu_result {self.name} (or handle.wait()), or cancel it with "
            f"%gpu_result {self.name} --cancel (or handle.cancel()); %gpu_pull and %gpu_push work meanwhile."
        )

    # ---- views -----------------------------------------------------------------------------------------------
    def _summary(self) -> str:
        states = self.rank_states()
        counts: dict[str, list[int]] = {}
        for r, s in states.items():
            counts.setdefault(s, []).append(r)
        per = "; ".join(f"{s}: ranks {format_ranks(rs)}" for s, rs in counts.items())
        return f"background cell {self.name}: {self.state}, {self._elapsed_text} ({per})"

    def _ending(self) -> str:
        if self.error is not None:
            return f"{type(self.error).__name__}: {self.error}"
        if self.result is None:
            return ""
        if self.result.failures:
            return str(_error_of(self.result, self.world_size))
        return self.result.note

    def __repr__(self) -> str:
        lines = [self._summary(), *self.output(VIEW_LINES)]
        if self.ready():
            ending = self._ending()
            lines += [ending] if ending else []
            if self.result is not None and not self.result.failures:
                lines.append(f"values: {self.result.values!r} (%gpu_result {self.name} shows them)")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        states = self.rank_states()
        cells = "".join(
            f"<td style='padding:0 .6em'>rank {r}: <b>{html.escape(s)}</b></td>" for r, s in states.items()
        )
        head = (
            f"<div><b>background cell {html.escape(self.name)}</b>: {html.escape(self.state)}, "
            f"{html.escape(self._elapsed_text)}</div><table><tr>{cells}</tr></table>"
        )
        out = "\n".join(self.output(VIEW_LINES))
        body = f"<pre style='max-height:30em;overflow:auto'>{html.escape(out)}</pre>" if out else ""
        with self._lock:
            shown = list(self.displays)
        body += "".join(f"<div>{_rich.view_html(b)}</div>" for b in shown)
        ending = self._ending() if self.ready() else ""
        tail = f"<pre>{html.escape(ending)}</pre>" if ending else ""
        return head + body + tail

    def _ipython_display_(self) -> None:
        """Shown as the cell's output: a display that the background thread keeps updating (see the module)."""
        from IPython.display import display

        self._shown = self.live  # outside a kernel an update would print the view again
        display(_View(self), display_id=self.display_id)

    def refresh(self) -> bool:
        """Update the live view now (a no-op unless it was shown); False when it could not be updated."""
        if not self._shown:
            return True
        try:
            from IPython.display import update_display

            update_display(_View(self), display_id=self.display_id)
        except Exception:  # noqa: BLE001 - the kernel is going away: nothing left to show it in
            return False
        return True

    def _refresher(self) -> None:
        """Update the live view when something changed (at most every REFRESH_S), and the elapsed time.

        The update is sent from this thread with the parent header of whichever cell runs now (a new thread
        has none of its own): a frontend takes it while that cell runs and applies it by display id.
        """
        while True:
            changed = self._dirty.wait(IDLE_REFRESH_S)
            self._dirty.clear()
            if not self.refresh():
                return
            if self._done.is_set() and not changed:
                return
            time.sleep(REFRESH_S)


class _View:
    """What the live display shows: the handle's reprs (the handle itself has ``_ipython_display_``)."""

    def __init__(self, cell: BackgroundCell) -> None:
        self._text = repr(cell)
        self._html = cell._repr_html_()

    def __repr__(self) -> str:
        return self._text

    def _repr_html_(self) -> str:
        return self._html


def _failed_state(kind: str, cancelled: bool) -> str:
    if kind == "stopped":
        return "stopped"
    return "cancelled" if cancelled and kind in ("interrupted", "error") else "failed"


def _error_of(result: CellResult, world_size: int) -> Exception:
    try:
        result.raise_for_failures(world_size)
    except Exception as exc:  # noqa: BLE001 - the DistributedError it raises, for its text
        return exc
    return RuntimeError("no failure")


def _stdout(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


# ---- the process's background cells ------------------------------------------------------------------------
def running_on(group: Any) -> BackgroundCell | None:
    """The background cell running on ``group`` now, if any."""
    cells = _registry.background_cells.items()
    return next((c for c in reversed(cells) if c.group is group and not c.ready()), None)


def refuse_second(group: Any, doing: str = "running another cell") -> None:
    """Raise :class:`BusyError` when a background cell runs on ``group``."""
    cell = running_on(group) if group is not None else None
    if cell is not None:
        raise BusyError(cell.busy_message(doing))


def find(name: str | None = None) -> BackgroundCell:
    """The background cell called ``name`` (the latest one when None)."""
    cells = _registry.background_cells.items()
    if not cells:
        raise LookupError("no background cell has run: start one with %%distributed --noblock")
    if name is None:
        return cells[-1]
    for c in reversed(cells):
        if c.name == name:
            return c
    raise LookupError(f"no background cell {name!r}: the recent ones are {', '.join(c.name for c in cells)}")


def _end_all(grace_s: float = 5.0) -> None:
    """At interpreter exit: cancel every running background cell and give them ``grace_s`` to end."""
    cells = [c for c in _registry.background_cells.items() if not c.ready()]
    for c in cells:
        try:
            c.cancel(timeout=0.5)
        except Exception:  # noqa: BLE001 - Ray may already be gone: the workers end with it
            pass
    deadline = time.monotonic() + grace_s
    for c in cells:
        c.wait(max(0.0, deadline - time.monotonic()))


atexit.register(_end_all)
