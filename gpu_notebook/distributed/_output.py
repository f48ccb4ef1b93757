"""Per-rank output: prefixing lines with their rank while streaming, and the driver-side log of each rank.

A progress bar (tqdm) redraws one line with ``\r`` and ends it with a newline only when it is done. While it
redraws, the :class:`Streamer` shows the line's latest state live (``\r[rank N] ...``, rate-limited); the
log and the cell's captured output keep what the line finally showed.

Both are bounded, so a cell that prints for hours does not grow the kernel: the log is a ring of each rank's
last :func:`~gpu_notebook._settings.log_lines` lines, and a cell keeps the first and last halves of
:func:`~gpu_notebook._settings.output_lines` lines of each rank (:class:`KeptLines`), with a
"... N lines dropped ..." line between; a line longer than :data:`~._settings.MAX_LINE_CHARS` is cut. A line being redrawn with ``\r``
keeps only its latest state while it waits for its newline.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable

from gpu_notebook._settings import LOG_LINES_VAR, OUTPUT_LINES_VAR, log_lines, output_lines
from gpu_notebook.distributed import _rich
from gpu_notebook.distributed._settings import MAX_LINE_CHARS

# Ray writes these markers into worker output to attribute log lines; they are not the user's output.
_RAY_MARKERS = (":actor_name:", ":task_name:", ":job_id:")


class RankLog:
    """The recent output of every rank, kept on the driver, so what a dead rank printed can still be read."""

    def __init__(self, max_lines: int | None = None) -> None:
        self.max_lines = log_lines() if max_lines is None else max_lines
        self._lines: dict[int, collections.deque[str]] = {}
        self._partial: dict[int, str] = {}
        self._fed: dict[
            int, int
        ] = {}  # complete lines ever added per rank (a cell's lines are those after a mark)
        self._lock = threading.Lock()

    def feed(self, rank: int, text: str) -> list[str]:
        """Add raw text from a rank; returns the complete lines it finished."""
        if not text:
            return []
        with self._lock:
            buf = self._partial.get(rank, "") + text.replace("\r\n", "\n")
            *complete, rest = buf.split("\n")
            self._partial[rank] = _compact(rest)
            # a progress bar (tqdm) redraws its line with \r: keep what the line finally showed
            complete = [_cut(_final_state(line)) for line in complete]
            complete = [line for line in complete if not line.startswith(_RAY_MARKERS)]
            dq = self._lines.setdefault(rank, collections.deque(maxlen=self.max_lines))
            dq.extend(complete)
            self._fed[rank] = self._fed.get(rank, 0) + len(complete)
            return complete

    def note(self, rank: int, line: str) -> None:
        """Add a line that did not come as text (a display's summary), leaving an unfinished line as it is."""
        with self._lock:
            self._lines.setdefault(rank, collections.deque(maxlen=self.max_lines)).append(line)
            self._fed[rank] = self._fed.get(rank, 0) + 1

    def live(self, rank: int) -> str | None:
        """What a rank's unfinished line shows now, if it is being redrawn with ``\r`` (else None)."""
        with self._lock:
            rest = self._partial.get(rank, "")
        if "\r" not in rest:
            return None
        return _final_state(rest) or None

    def flush(self, rank: int) -> list[str]:
        """End a rank's partial line (at the end of a cell), keeping what it finally showed."""
        with self._lock:
            rest = _cut(_final_state(self._partial.pop(rank, "")))
            if not rest:
                return []
            self._lines.setdefault(rank, collections.deque(maxlen=self.max_lines)).append(rest)
            self._fed[rank] = self._fed.get(rank, 0) + 1
            return [rest]

    def mark(self) -> dict[int, int]:
        """Where each rank's log is now: :meth:`since` gives the lines added after it (a cell's own)."""
        with self._lock:
            return dict(self._fed)

    def since(self, rank: int, mark: dict[int, int], n: int) -> list[str]:
        """The last ``n`` lines of ``rank`` added after ``mark`` (from :meth:`mark`), its unfinished one too.

        Whoever drained them (the cell's stream, or ``%gpu_cluster logs`` meanwhile), and none from before.
        """
        with self._lock:
            new = self._fed.get(rank, 0) - mark.get(rank, 0)
            dq = self._lines.get(rank, ())
            lines = list(dq)[len(dq) - min(new, len(dq)) :] if new > 0 else []
            if self._partial.get(rank):
                lines.append(self._partial[rank])
        return lines[-n:] if n > 0 else []

    def dropped(self, rank: int) -> int:
        """How many of ``rank``'s lines the ring no longer holds (the oldest go first)."""
        with self._lock:
            return max(0, self._fed.get(rank, 0) - len(self._lines.get(rank, ())))

    def tail(self, rank: int, n: int | None = None) -> list[str]:
        """The last ``n`` lines of ``rank`` (all it keeps if None), after a line saying how many earlier lines
        the ring dropped, if any."""
        with self._lock:
            lines = list(self._lines.get(rank, ()))
            dropped = max(0, self._fed.get(rank, 0) - len(lines))
            if self._partial.get(rank):
                lines.append(self._partial[rank])
        lines = lines if n is None else lines[-n:] if n > 0 else []
        if dropped and lines:
            lines.insert(
                0,
                f"... {dropped:,} earlier lines dropped (the log keeps each rank's last {self.max_lines:,} "
                f"lines: set {LOG_LINES_VAR} before starting the cluster to keep more) ...",
            )
        return lines

    def ranks(self) -> list[int]:
        with self._lock:
            return sorted(set(self._lines) | set(self._partial))

    def clear(self) -> None:
        with self._lock:
            self._lines.clear()
            self._partial.clear()
            self._fed.clear()


def _final_state(line: str) -> str:
    """What a line redrawn with ``\r`` shows last: its last non-empty ``\r`` segment."""
    if "\r" not in line:
        return line
    for segment in reversed(line.split("\r")):
        if segment:
            return segment
    return ""


def _compact(rest: str) -> str:
    """An unfinished line redrawn with ``\r``, reduced to its latest state (the same when more text comes):
    a progress bar redrawn for hours must not pile up every redraw while it waits for its newline."""
    at = rest.rfind("\r")
    if at < 0:
        return rest
    if at < len(rest) - 1:  # text after the last \r: later text extends it
        return rest[at:]
    state = _final_state(rest)
    return "\r" + state + "\r" if state else ""


def _cut(line: str) -> str:
    """``line``, cut to :data:`MAX_LINE_CHARS` characters saying how many were dropped."""
    if len(line) <= MAX_LINE_CHARS:
        return line
    return line[:MAX_LINE_CHARS] + f" ... ({len(line) - MAX_LINE_CHARS:,} characters dropped)"


class KeptLines:
    """One rank's output in one cell, bounded: its first ``cap // 2`` lines, its last ``cap - cap // 2``, and
    how many between them were dropped."""

    def __init__(self, cap: int) -> None:
        self.cap = max(2, cap)
        self.head: list[str] = []
        self.tail: collections.deque[str] = collections.deque(maxlen=self.cap - self.cap // 2)
        self.dropped = 0

    def extend(self, lines: list[str]) -> None:
        room = self.cap // 2 - len(self.head)
        if room > 0:
            self.head.extend(lines[:room])
            lines = lines[room:]
        maxlen = self.tail.maxlen or 0
        self.dropped += max(0, len(self.tail) + len(lines) - maxlen)
        self.tail.extend(lines[-maxlen:])

    def lines(self) -> list[str]:
        """The kept lines, with a "... N lines dropped ..." line where lines were dropped."""
        if not self.dropped:
            return [*self.head, *self.tail]
        marker = (
            f"... {self.dropped:,} lines dropped (a cell keeps each rank's first {len(self.head):,} and last "
            f"{len(self.tail):,} lines: set {OUTPUT_LINES_VAR} to keep more; %gpu_cluster logs has the "
            f"latest) ..."
        )
        return [*self.head, marker, *self.tail]

    def __len__(self) -> int:
        return len(self.head) + len(self.tail)

    def chars(self) -> int:
        """How many characters the kept lines hold."""
        return sum(map(len, self.head)) + sum(map(len, self.tail))


def prefix(rank: int, line: str) -> str:
    return f"[rank {rank}] {line}"


class Streamer:
    """Feeds rank output into a :class:`RankLog` and writes complete lines, prefixed, to a sink.

    A line being redrawn with ``\r`` is also written live, as ``\r[rank N] <latest state>`` without a newline,
    at most once every ``live_interval`` seconds per rank; the next line written starts with ``\r`` so it
    replaces it. Only complete lines are captured, at most ``max_lines`` per rank (None:
    :func:`~gpu_notebook._settings.output_lines`; see :class:`KeptLines`).
    """

    def __init__(
        self,
        log: RankLog,
        sink: Callable[[str], None] | None,
        live_interval: float = 0.3,
        max_lines: int | None = None,
        ranks: list[int] | None = None,
    ) -> None:
        self.log = log
        self.sink = sink
        self.live_interval = live_interval
        self.max_lines = output_lines() if max_lines is None else max_lines
        self.kept: dict[int, KeptLines] = {}
        self._live_shown: dict[int, tuple[float, str]] = {}
        self._live_open = False  # the sink's current line is a live state, not ended by a newline
        self.ranks = list(ranks or [])  # the cell's ranks: identical displays of all of them are shown once
        self.filter = _rich.current_filter() if sink is not None else None  # --output-ranks
        self.router: _rich.Router | None = None  # displays and per-rank \r lines (see _rich), once needed
        self.debugger: dict[
            int, bool
        ] = {}  # rank -> paused in the debugger, as its markers said (see _debug)
        self.pause_news = False  # a rank paused since the cell's wait last looked

    def _router(self) -> _rich.Router:
        if self.router is None:
            assert self.sink is not None
            shown = [r for r in self.ranks if not self._hidden(r)]  # hidden ranks' displays never come here
            self.router = _rich.Router(shown, self.sink, self._write)
        return self.router

    def _hidden(self, rank: int) -> bool:
        return self.filter is not None and rank not in self.filter.shown

    def feed(self, rank: int, text: str) -> None:
        for part in _rich.split(text) if text else ():
            if isinstance(part, str):
                self._emit_all(rank, self.log.feed(rank, part))
                continue
            if _rich.PAUSED_MIME in part["data"]:  # not a display: the rank paused in (or left) the debugger
                self.debugger[rank] = bool(part["data"][_rich.PAUSED_MIME].get("paused"))
                self.pause_news = self.pause_news or self.debugger[rank]
                continue
            self.log.note(rank, _rich.summary(part))
            if self.sink is None:
                continue
            if self._hidden(rank):
                assert self.filter is not None
                self.filter.hidden_displays[rank] = self.filter.hidden_displays.get(rank, 0) + 1
            else:
                self._router().bundle(rank, part)
        if self.sink is None or self._hidden(rank) or (self.router is not None and self.router.held(rank)):
            return
        state = self.log.live(rank)
        if state is None:
            return
        now = time.monotonic()
        last_at, last_state = self._live_shown.get(rank, (float("-inf"), ""))
        if state != last_state and now - last_at >= self.live_interval:
            self._live_shown[rank] = (now, state)
            if self._router().updates_in_place():  # a kernel: one display per rank, updated in place
                self.router.show_live(rank, prefix(rank, state))  # type: ignore[union-attr]
                return
            self.sink("\r" + prefix(rank, state))
            self._live_open = True

    def say(self, text: str) -> None:
        """A message of ours (not a rank's) in the cell's output, on lines of its own."""
        if self.sink is not None:
            self.sink(("\n" if self._live_open else "") + text.rstrip("\n") + "\n")
            self._live_open = False

    def tick(self) -> None:
        """Show held displays that waited long enough for the same one from other ranks."""
        if self.router is not None:
            self.router.release()

    @property
    def captured(self) -> dict[int, list[str]]:
        """Each rank's kept lines of the cell, with a "... N lines dropped ..." line where some were dropped."""
        return {rank: kept.lines() for rank, kept in self.kept.items()}

    def finish(self, rank: int) -> None:
        self._emit_all(rank, self.log.flush(rank))
        if self.router is not None:
            self.router.finish(rank)

    def _emit_all(self, rank: int, lines: list[str]) -> None:
        """Capture complete lines and write them to the sink in one call: a cell printing thousands of lines
        must not cost one write (and, in a kernel, one message to the browser) per line."""
        if not lines:
            return
        kept = self.kept.get(rank)
        if kept is None:
            kept = self.kept[rank] = KeptLines(self.max_lines)
        kept.extend(lines)
        self._live_shown.pop(rank, None)
        if self.sink is None:
            return
        if self._hidden(rank):  # --output-ranks: kept (and in the log), not shown
            assert self.filter is not None
            self.filter.hidden_lines[rank] = self.filter.hidden_lines.get(rank, 0) + len(lines)
        elif self.router is not None:
            self.router.lines(rank, lines)
        else:
            self._write(rank, lines)

    def _write(self, rank: int, lines: list[str]) -> None:
        assert self.sink is not None
        if self.router is not None and lines and self.router.end_live(rank, prefix(rank, lines[0])):
            lines = lines[1:]  # the line its display showed while it was redrawn: that display shows it now
            if not lines:
                return
        text = "".join(prefix(rank, line) + "\n" for line in lines)
        self.sink(("\r" if self._live_open else "") + text)
        self._live_open = False
