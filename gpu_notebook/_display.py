"""Small text formatters shared by every layer: byte sizes, durations, rank lists, progress stamps, first lines of
errors and of output.

Nothing here imports a heavy module. Widgets' live-view base class lives in :mod:`gpu_notebook.widgets`
(the library never imports the widgets).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

__all__ = [
    "Progress",
    "error_line",
    "first_line",
    "fmt_bytes",
    "fmt_duration",
    "format_ranks",
    "rank_label",
    "stage_printer",
    "stamp",
    "text_table",
]

#: A callback that receives one line of progress for the user (a stage of a start, a launch, a save).
Progress = Callable[[str], None]


def first_line(text: str) -> str:
    """The first non-blank line of ``text``, stripped ('' if there is none).

    >>> first_line("\\n  Traceback (most recent call last):\\n  ...")
    'Traceback (most recent call last):'
    """
    for line in text.strip().splitlines():
        if line.strip():
            return line.strip()
    return ""


def error_line(exc: BaseException, limit: int = 300) -> str:
    """``"TypeName: first line of the message"``, cut to ``limit`` characters: an error in one line.

    >>> error_line(ValueError("bad value\\nmore detail"))
    'ValueError: bad value'
    """
    return f"{type(exc).__name__}: {first_line(str(exc))}"[:limit]


#: the units a byte count can be pinned to (``fmt_bytes(n, unit="MB")``), in bytes
_UNITS = {"KB": 1e3, "MB": 1e6, "GB": 1e9, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}


def fmt_bytes(n: float, *, binary: bool = False, unit: str | None = None, digits: int = 1) -> str:
    """A byte count for people: decimal units (``"1.5 MB"``) or, with ``binary``, IEC units (``"1.5 MiB"``).

    Decimal is what storage and network bills use; binary is what memory limits use. ``unit`` pins the unit
    (``"MB"``, ``"MiB"``, ...), with ``digits`` decimals: a column or a running count reads better in one unit.

    >>> fmt_bytes(999), fmt_bytes(1500), fmt_bytes(3 * 2**30, binary=True), fmt_bytes(512, binary=True)
    ('999 B', '1.5 KB', '3.0 GiB', '512 bytes')
    >>> fmt_bytes(20_000, unit="MB"), fmt_bytes(3 * 2**19, unit="MiB"), fmt_bytes(2**26, unit="GiB", digits=2)
    ('0.0 MB', '1.5 MiB', '0.06 GiB')
    """
    if unit is not None:
        return f"{n / _UNITS[unit]:.{digits}f} {unit}"
    if binary:
        if n < 1024:
            return f"{n:g} bytes"
        units = ("KiB", "MiB", "GiB", "TiB")
        i = 0
        n /= 1024
        while n >= 1024 and i < len(units) - 1:
            n /= 1024
            i += 1
        return f"{n:.1f} {units[i]}"
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def fmt_duration(s: float, *, round_up: bool = False, minutes: bool = False) -> str:
    """Seconds for people: ``45s``, ``3m05s``, ``2h10m``; whole seconds cut off, or with ``round_up`` rounded up
    (a countdown never says ``0s`` while time is left); ``minutes`` shows them under a minute too (``0m45s``),
    as a countdown that ticks in place.

    >>> fmt_duration(45.9), fmt_duration(45.1, round_up=True), fmt_duration(185), fmt_duration(7830)
    ('45s', '46s', '3m05s', '2h10m')
    >>> fmt_duration(30, minutes=True), fmt_duration(-3)
    ('0m30s', '0s')
    """
    n = max(0, int(math.ceil(s)) if round_up else int(s))
    if n < 60 and not minutes:
        return f"{n}s"
    if n < 3600:
        return f"{n // 60}m{n % 60:02d}s"
    return f"{n // 3600}h{(n % 3600) // 60:02d}m"


def format_ranks(ranks: Sequence[int]) -> str:
    """Compact form of a rank list: ``[0, 1, 2, 5]`` -> ``0-2,5``.

    >>> format_ranks([5, 0, 1, 2])
    '0-2,5'
    """
    ranks = sorted(ranks)
    out: list[str] = []
    i = 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        out.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ",".join(out)


def rank_label(ranks: Sequence[int]) -> str:
    """Who said it, as the reports name ranks: ``rank 3``, or ``ranks 0-2,5`` for several.

    >>> rank_label([3]), rank_label([0, 1, 2, 5])
    ('rank 3', 'ranks 0-2,5')
    """
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {format_ranks(ranks)}"


def stamp(elapsed_s: float, msg: str) -> str:
    """One progress line with the time since its operation began: ``[   3.2s] connecting to Ray``.

    >>> stamp(3.21, "connecting to Ray")
    '[   3.2s] connecting to Ray'
    """
    return f"[{elapsed_s:6.1f}s] {msg}"


def stage_printer() -> Progress:
    """A :data:`Progress` callback that prints each stage with the time since the callback was made (what the
    magics pass to a start, a scale or a teardown)."""
    t0 = time.monotonic()

    def say(msg: str) -> None:
        print(stamp(time.monotonic() - t0, msg), flush=True)

    return say


def text_table(header: list[str], rows: list[list[str]]) -> str:
    """Rows as left-aligned columns under a header: the ``text/plain`` twin of an HTML table.

    >>> print(text_table(["node", "CPU %"], [["a1", "12"], ["b", "7"]]))
    node  CPU %
    a1    12
    b     7
    """
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    return "\n".join(
        "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [header, *rows]
    )
