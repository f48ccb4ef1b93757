"""Helpers shared by the magics: argument parsing that prints usage instead of a traceback, progress lines."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic_arguments import parse_argstring


class BadArguments(Exception):
    """Raised after the usage has been printed; the magic returns quietly."""


def parse(magic_func: Callable[..., Any], line: str) -> Any:
    """Parse a magic's arguments; on a mistake print the error and the usage to stderr and raise BadArguments."""
    try:
        return parse_argstring(magic_func, line)
    except (UsageError, SystemExit) as exc:
        parser = magic_func.parser  # type: ignore[attr-defined]  # set by @magic_arguments
        msg = str(exc) if isinstance(exc, UsageError) else "bad arguments"
        print(
            f"UsageError: {msg}\n\n{parser.format_usage()}Try {help_name(magic_func)}? for help.",
            file=sys.stderr,
        )
        raise BadArguments(msg) from None


def help_name(magic_func: Callable[..., Any]) -> str:
    """How to ask for a magic's help: ``%gpu_push`` for a line magic, ``%%distributed`` for a cell magic
    (``%distributed?`` finds nothing)."""
    name = magic_func.parser.prog  # type: ignore[attr-defined]  # set by @magic_arguments
    owner = getattr(magic_func, "__self__", None)
    cell_magics = getattr(owner, "magics", {}).get("cell", {})
    return (
        f"%%{name}"
        if name in cell_magics and name not in getattr(owner, "magics", {}).get("line", {})
        else f"%{name}"
    )


def progress_printer() -> Callable[[str], None]:
    """A progress callback that prints each stage with the elapsed time."""
    t0 = time.monotonic()

    def say(msg: str) -> None:
        print(f"[{time.monotonic() - t0:6.1f}s] {msg}", flush=True)

    return say


def error(msg: str) -> None:
    print(f"Error: {msg}", file=sys.stderr)


def show(obj: Any) -> None:
    """Display a result object: its HTML in notebooks, its full text table in terminals and saved text."""
    from IPython.display import display

    text_fn = getattr(obj, "text", None)
    text = text_fn() if callable(text_fn) else str(obj)
    bundle = {"text/plain": text}
    html_fn = getattr(obj, "_repr_html_", None)
    if callable(html_fn):
        html = html_fn()
        if html:
            bundle["text/html"] = html
    display(bundle, raw=True)
