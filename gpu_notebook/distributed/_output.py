"""Per-rank output: prefixing lines with their rank while streaming, and the driver-side log of each rank.

A progress bar (tqdm) redraws one line with ``\r`` and ends it with a newline only when it is done. While it
redraws, the :class:`Streamer` shows the line's latest state live (``\r[rank N] ...``, rate-limited); the
log and the cell's captured output keep what the line finally showed.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable

# Ray writes these markers into worker output to attribute log lines; they are not the user's output.
_RAY_MARKERS = (":actor_name:", ":task_name:", ":job_id:")


class RankLog:
    """The recent output of every rank, kept on the driver, so what a dead rank printed can still be read."""

    def __init__(self, max_lines: int = 5000) -> None:
        self.max_lines = max_lines
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
            self._partial[rank] = rest
            # a progress bar (tqdm) redraws its line with \r: keep what the line finally showed
            complete = [_final_state(line) for line in complete]
            complete = [line for line in complete if not line.startswith(_RAY_MARKERS)]
            dq = self._lines.setdefault(rank, collections.deque(maxlen=self.max_lines))
            dq.extend(complete)
            self._fed[rank] = self._fed.get(rank, 0) + len(complete)
            return complete

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
            rest = _final_state(self._partial.pop(rank, ""))
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

    def tail(self, rank: int, n: int | None = None) -> list[str]:
        with self._lock:
            lines = list(self._lines.get(rank, ()))
            if self._partial.get(rank):
                lines.append(self._partial[rank])
        return lines if n is None else lines[-n:] if n > 0 else []

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


def prefix(rank: int, line: str) -> str:
    return f"[rank {rank}] {line}"


class Streamer:
    """Feeds rank output into a :class:`RankLog` and writes complete lines, prefixed, to a sink.

    A line being redrawn with ``\r`` is also written live, as ``\r[rank N] <latest state>`` without a newline,
    at most once every ``live_interval`` seconds per rank; the next line written starts with ``\r`` so it
    replaces it. Only complete lines are captured.
    """

    def __init__(self, log: RankLog, sink: Callable[[str], None] | None, live_interval: float = 0.3) -> None:
        self.log = log
        self.sink = sink
        self.live_interval = live_interval
        self.captured: dict[int, list[str]] = collections.defaultdict(list)
        self._live_shown: dict[int, tuple[float, str]] = {}
        self._live_open = False  # the sink's current line is a live state, not ended by a newline

    def feed(self, rank: int, text: str) -> None:
        lines = self.log.feed(rank, text)
        self._emit_all(rank, lines)
        if self.sink is None:
            return
        state = self.log.live(rank)
        if state is None:
            return
        now = time.monotonic()
        last_at, last_state = self._live_shown.get(rank, (float("-inf"), ""))
        if state != last_state and now - last_at >= self.live_interval:
            self._live_shown[rank] = (now, state)
            self.sink("\r" + prefix(rank, state))
            self._live_open = True

    def finish(self, rank: int) -> None:
        self._emit_all(rank, self.log.flush(rank))

    def _emit_all(self, rank: int, lines: list[str]) -> None:
        """Capture complete lines and write them to the sink in one call: a cell printing thousands of lines
        must not cost one write (and, in a kernel, one message to the browser) per line."""
        if not lines:
            return
        self.captured[rank].extend(lines)
        self._live_shown.pop(rank, None)
        if self.sink is not None:
            text = "".join(prefix(rank, line) + "\n" for line in lines)
            self.sink(("\r" if self._live_open else "") + text)
            self._live_open = False
