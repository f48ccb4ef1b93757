"""The live-view base class of our widgets: a refresh thread, start/stop/close, display with static fallbacks.

A live view is a cached view of one library object (a monitor, a cost meter): stock ipywidgets in ``self.box``
that a daemon thread refreshes every ``interval`` seconds, so the kernel stays free for cells. Its mime bundle
carries ``text/plain`` and a static ``text/html`` snapshot next to the widget view, so a saved notebook (or a
front end without the widget manager) shows the last numbers instead of an empty box; :meth:`LiveView.stop`,
and the end of the refresh thread when the object shown ends (its cluster or monitor stopped), replace a view
shown with :meth:`LiveView.show` by that snapshot.

Every comm message a view's widgets send is counted in a :class:`RateCap` (``self.rate``), which is how the
views keep to their message budget.
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any, Self

__all__ = ["LiveView", "RateCap", "Static", "live_views", "stop_live_views"]

# every view whose refresh thread runs, whoever started it: the magics that made them may have been reloaded
# (``%reload_ext gpu_notebook``) and lost their own lists, but the threads go on until stopped
_LIVE: weakref.WeakSet[LiveView] = weakref.WeakSet()
_LIVE_LOCK = threading.Lock()


def live_views(kind: type | None = None) -> list[LiveView]:
    """The views (of ``kind``, a LiveView subclass; None for all) whose refresh thread runs."""
    with _LIVE_LOCK:
        views = list(_LIVE)
    return [v for v in views if v.live and (kind is None or isinstance(v, kind))]


def stop_live_views(kind: type | None = None) -> int:
    """Stop every live view (of ``kind``); returns how many were stopped."""
    views = live_views(kind)
    for v in views:
        v.stop()
    return len(views)


class Static:
    """A static result that says the same as ``text/html`` and as ``text/plain``.

    What a magic displays instead of a bare ``IPython.display.HTML`` (which a terminal or a plain-text log
    shows as ``<IPython.core.display.HTML object>``).
    """

    def __init__(self, html: str, text: str) -> None:
        self.html = html
        self.text = text

    def _repr_html_(self) -> str:
        return self.html

    def __repr__(self) -> str:
        return self.text

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(self.text)


class RateCap:
    """Sliding-window message counter: at most ``max_per_s`` messages in any ``window_s`` seconds."""

    def __init__(self, max_per_s: float, clock: Callable[[], float], window_s: float = 1.0) -> None:
        self.max = float(max_per_s) * window_s
        self.window = float(window_s)
        self.clock = clock
        self.events: deque[float] = deque()
        self.total = 0

    def record(self, n: int = 1) -> None:
        now = self.clock()
        for _ in range(n):
            self.events.append(now)
        self.total += n

    def recent(self) -> int:
        cutoff = self.clock() - self.window
        while self.events and self.events[0] <= cutoff:
            self.events.popleft()
        return len(self.events)

    def allows(self, cost: int) -> bool:
        """Whether ``cost`` more messages fit (an empty window always admits one refresh)."""
        recent = self.recent()
        return recent == 0 or recent + cost <= self.max


class LiveView:
    """Base class of a widget that a background thread keeps up to date.

    A subclass calls :meth:`_init_live` early in its ``__init__`` and then must provide:

    - ``self.box``: the ipywidgets container that is displayed (its ``comm`` goes to ``None`` when closed);
    - :meth:`_parts`: every widget to close on :meth:`close`;
    - :meth:`refresh` ``(force=False) -> bool``: send what changed, at most what ``self.rate`` allows;
    - :meth:`snapshot_html`: the static HTML fallback (no scripts, no images);
    - :meth:`_text_plain`: the one-line ``text/plain`` fallback (and :meth:`snapshot_text`, the plain-text twin of
      :meth:`snapshot_html`, where that one line does not say the same).

    It may override :meth:`_tick` (what one timer tick does; default :meth:`refresh`), :meth:`_finished`
    (whether the object shown has ended, after which one last forced refresh ends the thread) and
    :meth:`_thread_started` (called once in the refresh thread before its first tick).
    """

    interval: float
    box: Any
    rate: RateCap
    #: the refresh thread's name (``gpu_notebook-*``: benchmarks find our threads by it)
    thread_name = "gpu_notebook-live-view"

    def _init_live(self, rate: RateCap) -> None:
        self.rate = rate
        self._lock = threading.Lock()  # one refresh at a time: the thread's and a caller's
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._handle: Any = None  # the display handle of show(), so stop() can leave a snapshot behind

    # -- what a subclass provides ------------------------------------------------------------------------------
    def refresh(self, force: bool = False) -> bool:
        raise NotImplementedError

    def snapshot_html(self) -> str:
        raise NotImplementedError

    def _text_plain(self) -> str:
        return repr(self)

    def snapshot_text(self) -> str:
        """The static snapshot as plain text (what :meth:`stop` leaves for a terminal or a plain-text log)."""
        return self._text_plain()

    def _parts(self) -> tuple[Any, ...]:
        return (self.box,)

    def _tick(self) -> None:
        self.refresh()

    def _finished(self) -> bool:
        return False

    def _thread_started(self) -> None:
        return None

    # -- message counting ----------------------------------------------------------------------------------------
    def _count(self, widget: Any) -> None:
        """Count every message ``widget`` sends in ``self.rate`` (once per comm, whichever view wraps it)."""
        comm = getattr(widget, "comm", None)
        if comm is None or getattr(comm, "_gnb_counted", False):
            return
        orig = comm.send
        rate = self.rate

        def send(*args: Any, **kwargs: Any) -> Any:
            rate.record()
            return orig(*args, **kwargs)

        comm.send = send
        comm._gnb_counted = True

    @property
    def messages_sent(self) -> int:
        """Total comm messages sent by this view's widgets since creation."""
        return self.rate.total

    # -- the refresh thread ----------------------------------------------------------------------------------------
    def _closed(self) -> bool:
        """The view was closed (``close()``, ``Widget.close_all()``): its comm is gone, nothing to update."""
        return getattr(self.box, "comm", True) is None

    def _run(self) -> None:
        self._thread_started()
        while not self._stop.wait(self.interval):
            if self._closed():
                break
            last = self._finished()  # the object shown ended (monitor stopped): show the end, then quit
            try:
                if last:
                    self.refresh(force=True)
                else:
                    self._tick()
            except Exception:  # noqa: BLE001 - a display problem must never reach the user's cells
                pass
            if last:
                self._leave_snapshot()
                break

    @property
    def live(self) -> bool:
        """Whether the refresh thread runs."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> Self:
        """Start the background refresh thread (idempotent)."""
        if not self.live:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, daemon=True, name=self.thread_name)
            self._thread.start()
            with _LIVE_LOCK:
                _LIVE.add(self)
        return self

    def stop(self, snapshot: bool = True) -> None:
        """Stop refreshing; a view shown with :meth:`show` is replaced by its static snapshot."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._thread = None
        with _LIVE_LOCK:
            _LIVE.discard(self)
        if snapshot:
            self._leave_snapshot()

    def _leave_snapshot(self) -> None:
        """Replace a view shown with :meth:`show` by its static snapshot (a saved notebook, or one exported
        without widget state, then shows the last numbers instead of "Loading widget...")."""
        if self._handle is None:
            return
        try:
            self._handle.update(Static(self.snapshot_html(), self.snapshot_text()))
        except Exception:  # noqa: BLE001 - a display problem must never reach the user's cells
            pass

    def close(self) -> None:
        """Stop refreshing and close the widgets (their browser views go away); the object shown keeps running."""
        self.stop(snapshot=False)
        for w in self._parts():
            try:
                w.close()
            except Exception:  # noqa: BLE001 - one widget's failure must not leave the others open
                pass

    # -- display -------------------------------------------------------------------------------------------------
    def _show(self) -> Any:
        """Display the view and keep the handle, so :meth:`stop` can leave a static snapshot behind."""
        from IPython.display import display

        self._handle = display(self, display_id=True)
        return self._handle

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        bundle = dict(self.box._repr_mimebundle_(include=include, exclude=exclude) or {})
        bundle["text/html"] = self.snapshot_html()
        bundle["text/plain"] = self._text_plain()
        return bundle
