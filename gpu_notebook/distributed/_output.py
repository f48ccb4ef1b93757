"""Per-rank output: prefixing lines with their rank while streaming, and the driver-side log of each rank."""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable

# Ray writes these markers into worker output to attribute log lines; they are not the user's output.
_RAY_MARKERS = (":actor_name:", ":task_name:", ":job_id:")


class RankLog:
    """The recent output of every rank, kept on the driver, so what a dead rank printed can still be read."""

    def __init__(self, max_lines: int = 5000) -> None:
        self.max_lines = max_lines
        self._lines: dict[int, collections.deque[str]] = {}
        self._partial: dict[int, str] = {}
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
            complete = [line.rsplit("\r", 1)[-1] for line in complete]
            complete = [line for line in complete if not line.startswith(_RAY_MARKERS)]
            dq = self._lines.setdefault(rank, collections.deque(maxlen=self.max_lines))
            dq.extend(complete)
            return complete

    def flush(self, rank: int) -> list[str]:
        """End a rank's partial line (at the end of a cell)."""
        with self._lock:
            rest = self._partial.pop(rank, "")
            if not rest:
                return []
            self._lines.setdefault(rank, collections.deque(maxlen=self.max_lines)).append(rest)
            return [rest]

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


def prefix(rank: int, line: str) -> str:
    return f"[rank {rank}] {line}"


class Streamer:
    """Feeds rank output into a :class:`RankLog` and writes complete lines, prefixed, to a sink."""

    def __init__(self, log: RankLog, sink: Callable[[str], None] | None) -> None:
        self.log = log
        self.sink = sink
        self.captured: dict[int, list[str]] = collections.defaultdict(list)

    def feed(self, rank: int, text: str) -> None:
        for line in self.log.feed(rank, text):
            self._emit(rank, line)

    def finish(self, rank: int) -> None:
        for line in self.log.flush(rank):
            self._emit(rank, line)

    def _emit(self, rank: int, line: str) -> None:
        self.captured[rank].append(line)
        if self.sink is not None:
            self.sink(prefix(rank, line) + "\n")
