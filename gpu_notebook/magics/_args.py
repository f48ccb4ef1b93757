"""The typed argument parsers every magic's options use, and the shell-style splitting of a magic's line.

Each parser is an argparse ``type=``: it takes the text the user typed and returns the value, or raises
:class:`argparse.ArgumentTypeError` with a message that says what is accepted and repeats the value
(``must be a positive number of US dollars up to 1e+06, not 'nan'``); :func:`gpu_notebook.magics._common.parse`
turns that into a :class:`~IPython.core.error.UsageError` that names the option. So every value is checked
before a magic does anything: ``start --budget nan`` never starts a cluster to fail afterwards.

Numbers are finite (``nan`` and ``inf`` are refused everywhere) and bounded: a bound is what still makes sense
in a notebook (a budget of ``1e308`` dollars is a typo, not a policy).

A magic's line is split as a POSIX shell splits it (:func:`split`): ``"runs/my store"`` is one argument without
its quotes, ``'a b'`` too; an unclosed quote is a usage error. (IPython's own ``parse_argstring`` keeps the quotes:
it splits with ``posix=False``.) On Windows a backslash is a path separator, not an escape.
"""

from __future__ import annotations

import argparse
import keyword
import math
import os
import re
import shlex
from collections.abc import Callable
from typing import Any

from IPython.core.error import UsageError

from gpu_notebook.doctor import parse_size

__all__ = [
    "ArgParser",
    "budget_usd",
    "convert",
    "hourly_usd",
    "count",
    "duration",
    "identifier",
    "idle_minutes",
    "k8s_namespace",
    "name",
    "number",
    "path",
    "percent",
    "rank_list",
    "rank_number",
    "size",
    "split",
    "tcp_port",
    "text",
]

ArgParser = Callable[[str], Any]


def _comment_start(line: str) -> int:
    """Where a shell comment starts in ``line``: at a ``#`` that begins an unquoted word (else ``len(line)``).

    As in a POSIX shell, a ``#`` inside a word (a URL fragment, ``run#3``) or inside quotes is text.
    """
    quote, escaped = "", False
    for i, ch in enumerate(line):
        if escaped:
            escaped = False
        elif ch == "\\" and quote != "'" and os.name != "nt":
            escaped = True
        elif quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return i
    return len(line)


def split(line: str) -> list[str]:
    """A magic's line split as a POSIX shell splits it: quotes group words and are removed, and a ``#`` that
    begins a word starts a comment (``%gpu_cluster list  # which ones?`` lists).

    >>> split('use "runs/my store" --path \\'a b.csv\\'  # a comment')
    ['use', 'runs/my store', '--path', 'a b.csv']
    >>> split('use s3://bucket/run#3 --name "#1"')
    ['use', 's3://bucket/run#3', '--name', '#1']
    """
    line = line[: _comment_start(line)]
    lex = shlex.shlex(line, posix=True)
    lex.whitespace_split = True
    lex.commenters = ""  # comments are cut above: a '#' inside a word is part of a value
    if os.name == "nt":
        lex.escape = ""  # C:\data\x.csv is a path there, not escapes
    try:
        return list(lex)
    except ValueError as exc:  # shlex: "No closing quotation", "No escaped character"
        raise UsageError(f"{exc} in {line.strip()!r}: close the quote (or escape it with \\)") from None


def convert(parse: ArgParser, value: str, where: str) -> Any:
    """``parse(value)`` for a value that is not an option's (``scale N``); a bad one is a usage error that
    names ``where``."""
    try:
        return parse(value)
    except argparse.ArgumentTypeError as exc:
        raise UsageError(f"{where}: {exc}") from None


def _typed(parse: Callable[[str], Any], label: str) -> ArgParser:
    """``parse`` as an argparse ``type=`` named ``label`` (argparse names the type in a few messages)."""
    parse.__name__ = label
    return parse


def _fmt(value: float) -> str:
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else f"{value:g}"


def number(
    what: str,
    *,
    minimum: float = 0.0,
    maximum: float,
    allow_minimum: bool = False,
    integer: bool = False,
    zero: Any = ...,
    phrase: str | None = None,
) -> ArgParser:
    """A finite number in ``(minimum, maximum]`` (``[minimum, maximum]`` with ``allow_minimum``).

    Parameters
    ----------
    what
        What the number counts, for the message: ``"US dollars"``, ``"seconds"``, ``"workers"``.
    integer
        Only whole numbers (``2``, not ``2.5``).
    zero
        When given, ``0`` is accepted and means this value (``None``: no limit).
    phrase
        What the message says is accepted, when "a number of WHAT" does not read well (``a rank from 0 to 1024``).
    """
    kind = "whole number" if integer else "number"
    if allow_minimum:
        accepted = f"a {kind} of {what}, at least {_fmt(minimum)} and at most {_fmt(maximum)}"
    elif minimum == 0:
        accepted = f"a positive {kind} of {what} up to {_fmt(maximum)}"
    else:
        accepted = f"a {kind} of {what} over {_fmt(minimum)} and up to {_fmt(maximum)}"
    if zero is not ...:
        accepted += " (0: no limit)"
    accepted = phrase or accepted

    def parse(text: str) -> Any:
        try:
            value = int(text, 10) if integer else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {accepted}, not {text!r}") from None
        if zero is not ... and value == 0:
            return zero
        ok = math.isfinite(value) and value <= maximum
        ok = ok and (value >= minimum if allow_minimum else value > minimum)
        if not ok:
            raise argparse.ArgumentTypeError(f"expected {accepted}, not {text!r}")
        return value

    return _typed(parse, what)


def count(what: str, *, minimum: int = 1, maximum: int = 1_000_000) -> ArgParser:
    """A whole number of ``what`` from ``minimum`` to ``maximum``."""
    return number(what, minimum=minimum, maximum=maximum, allow_minimum=True, integer=True)


def rank_number(*, maximum: int = 1024) -> ArgParser:
    """One rank: a whole number from 0 (the cluster's size, known later, says which exist)."""
    return number(
        "rank",
        maximum=maximum,
        allow_minimum=True,
        integer=True,
        phrase=f"a rank (0, 1, ... up to {maximum})",
    )


def duration(
    *, minimum: float = 0.0, maximum: float = 7 * 24 * 3600.0, zero_is_no_limit: bool = False
) -> ArgParser:
    """Seconds: finite, over ``minimum`` (a period needs one: 1e-300 s would spin), at most a week; ``0``
    means no limit when ``zero_is_no_limit``."""
    zero = None if zero_is_no_limit else ...
    return number("seconds", minimum=minimum, maximum=maximum, allow_minimum=minimum > 0, zero=zero)


def percent() -> ArgParser:
    """A percentage from 0 to 100."""
    return number("percent", maximum=100.0, allow_minimum=True)


def tcp_port() -> ArgParser:
    """A TCP port, 0 (any free one) to 65535."""
    return number("TCP port (0: any free one)", maximum=65535, allow_minimum=True, integer=True)


def size(*, minimum: int = 1, zero_is_no_limit: bool = False) -> ArgParser:
    """Bytes: ``8``, ``64K``, ``128M``, ``2G`` (powers of 1024), at least ``minimum``; with
    ``zero_is_no_limit``, ``0`` (or ``none``) is 0, meaning no limit."""
    examples = "use e.g. 65536, 64K, 128M or 2G" + ("; 0 or none: no limit" if zero_is_no_limit else "")
    accepted = f"a size of at least {minimum} bytes and at most 1048576G ({examples})"

    def parse(text: str) -> int:
        if zero_is_no_limit and text.strip().lower() in ("0", "none", "unlimited"):
            return 0
        try:
            value = parse_size(text)
        except ValueError:
            value = -1
        if value < 0 or (value == 0 and not text.strip()):
            raise argparse.ArgumentTypeError(f"not a size: {text!r} ({examples})")
        if value < minimum or value > 2**50:
            raise argparse.ArgumentTypeError(f"expected {accepted}, not {text!r}")
        return value

    return _typed(parse, "size")


#: the highest rank a selection may name (a cluster has far fewer: the cluster says which exist)
MAX_RANK = 65535
_RANKS_RE = re.compile(r"\s*\d+(\s*-\s*\d+)?\s*(,\s*\d+(\s*-\s*\d+)?\s*)*,?\s*")


def rank_list() -> ArgParser:
    """A rank selection: ``all``, ``0,2``, ``0-3``, ``1,3-5``; kept as text (the cluster's size, known later,
    decides which ranks exist)."""
    accepted = "use 'all', a list like '0,2' or a range like '0-3'"  # as the library's parse_ranks says it

    def parse(text: str) -> str:
        t = text.strip()
        if t.lower() in ("all", "*"):
            return "all"
        if len(t) > 1000 or not _RANKS_RE.fullmatch(t):
            raise argparse.ArgumentTypeError(f"bad rank selection {text!r}: {accepted}")
        for part in t.split(","):
            lo, _, hi = part.partition("-")
            if hi.strip() and int(hi) < int(lo):
                raise argparse.ArgumentTypeError(f"bad rank selection {text!r}: a range goes up, as in '0-3'")
            if any(int(n) > MAX_RANK for n in (lo, hi) if n.strip()):  # 0-99999999999 would fill the memory
                raise argparse.ArgumentTypeError(f"bad rank selection {text!r}: ranks go up to {MAX_RANK}")
        return t

    return _typed(parse, "ranks")


_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")


def name(what: str = "name") -> ArgParser:
    """A name: 1-63 letters, digits, ``_``, ``.`` and ``-``, starting with a letter or digit."""
    accepted = f"a {what} of 1-63 letters, digits, '_', '.' and '-', starting with a letter or digit"

    def parse(text: str) -> str:
        if not _NAME_RE.fullmatch(text):
            raise argparse.ArgumentTypeError(f"expected {accepted}, not {text!r}")
        return text

    return _typed(parse, what)


_K8S_RE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def k8s_namespace() -> ArgParser:
    """A Kubernetes namespace: an RFC 1123 label (lowercase letters, digits and ``-``, at most 63)."""
    accepted = (
        "a namespace of 1-63 lowercase letters, digits and '-', starting and ending with a letter or digit"
    )

    def parse(text: str) -> str:
        if not _K8S_RE.fullmatch(text):
            raise argparse.ArgumentTypeError(f"expected {accepted}, not {text!r}")
        return text

    return _typed(parse, "namespace")


def identifier(what: str = "variable name") -> ArgParser:
    """A Python variable name (``loss``, ``model_2``): what a notebook namespace can hold."""

    def parse(text: str) -> str:
        if not text.isidentifier() or keyword.iskeyword(text):
            raise argparse.ArgumentTypeError(
                f"expected a Python {what} such as loss or model_2, not {text!r}"
            )
        return text

    return _typed(parse, what)


def path(what: str = "path") -> ArgParser:
    """A file or directory path: not empty, no NUL character; spaces are fine (quote them)."""

    def parse(text: str) -> str:
        if not text.strip() or "\0" in text:
            raise argparse.ArgumentTypeError(f"expected a {what} (quote one with spaces), not {text!r}")
        return text

    return _typed(parse, what)


def text(what: str) -> ArgParser:
    """Any text that is not empty or blank (an address, a region, a GPU type), without control characters."""

    def parse(value: str) -> str:
        if not value.strip() or any(ord(ch) < 32 for ch in value):
            raise argparse.ArgumentTypeError(f"expected {what}, not {value!r}")
        return value

    return _typed(parse, what)


def budget_usd() -> ArgParser:
    """``--budget``: US dollars, positive, at most a million (more is a typo, not a policy)."""
    return number("US dollars", maximum=1_000_000)


def idle_minutes() -> ArgParser:
    """``--idle-stop``: minutes, positive, at most a year."""
    return number("minutes", maximum=525_600)


def hourly_usd() -> ArgParser:
    """A price per CPU- or GPU-hour (``--price-cpu-hour``): US dollars, 0 (free) up to 10,000."""
    return number("US dollars", maximum=10_000, allow_minimum=True)
