"""Small text formatters shared by every layer: byte sizes, first lines of errors and of output.

Nothing here imports a heavy module. Widgets' live-view base class lives in :mod:`gpu_notebook.widgets`
(the library never imports the widgets).
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["Progress", "first_line", "error_line", "fmt_bytes", "text_table"]

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


def fmt_bytes(n: float, *, binary: bool = False) -> str:
    """A byte count for people: decimal units (``"1.5 MB"``) or, with ``binary``, IEC units (``"1.5 MiB"``).

    Decimal is what storage and network bills use; binary is what memory limits use.

    >>> fmt_bytes(999), fmt_bytes(1500), fmt_bytes(3 * 2**30, binary=True), fmt_bytes(512, binary=True)
    ('999 B', '1.5 KB', '3.0 GiB', '512 bytes')
    """
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
