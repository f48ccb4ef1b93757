"""Helpers shared by the magics: argument parsing, how failures are shown, the current cluster, progress lines.

A failing magic fails its cell, so "Run All", nbclient and papermill stop there, and it is shown in one short
message, never with our internals' traceback. There are three kinds: a usage mistake raises IPython's own
:class:`~IPython.core.error.UsageError` (IPython prints ``UsageError: <message>`` and no traceback; the message
ends with the usage and where the help is); one of our errors (:class:`~gpu_notebook.errors.GpuNotebookError`)
propagates with a ``_render_traceback_`` that IPython calls instead of formatting the traceback
(``ClusterError: <message>``); an optional dependency that is not installed becomes :class:`MissingExtra`, one of
ours (``...: pip install 'gpu_notebook[EXTRA]'``). Anything else is a bug and keeps its traceback; an error with
its own notebook display (the per-rank report of a failed ``%%distributed`` cell) keeps that. :class:`reported`
does this around a magic's body.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal, TypeVar

from IPython.core.error import UsageError
from IPython.core.magic_arguments import argument, parse_argstring

from gpu_notebook.errors import GpuNotebookError

F = TypeVar("F", bound=Callable[..., Any])

#: the top-level module an ImportError names -> the extra of gpu_notebook that installs it
EXTRAS = {
    "ray": "ray",
    "torch": "torch",
    "boto3": "aws",
    "botocore": "aws",
    "zstandard": "checkpoint",
    "blake3": "checkpoint",
    "pynvml": "monitor",
    "prometheus_client": "monitor",
    "ipywidgets": "widgets",
    "plotly": "widgets",
    "anywidget": "widgets",
    "googleapiclient": "gcp",
    "azure": "azure",
    "kubernetes": "kubernetes",
}


class BadArguments(UsageError):
    """Never raised: :func:`parse` raises a plain :class:`UsageError` (IPython shows only that exact class
    without a traceback). Kept so that ``except BadArguments`` in a magic still imports."""


class MagicError(GpuNotebookError):
    """A failure a magic found itself (no such cluster, a name not defined in the notebook)."""


class MissingExtra(MagicError, ImportError):
    """An optional dependency is not installed; the message says which extra of gpu_notebook installs it."""


def parse(magic_func: Callable[..., Any], line: str) -> Any:
    """Parse a magic's arguments; a mistake raises a :class:`UsageError` whose message ends with the usage."""
    try:
        return parse_argstring(magic_func, line)
    except (UsageError, SystemExit) as exc:
        msg = str(exc) if isinstance(exc, UsageError) else "bad arguments"
        raise usage_error(magic_func, msg) from None


def usage_error(magic_func: Callable[..., Any], msg: str) -> UsageError:
    """A :class:`UsageError` (that exact class: IPython prints its subclasses with a traceback) whose message is
    ``msg``, the magic's usage line and where its help is."""
    parser = magic_func.parser  # type: ignore[attr-defined]  # set by @magic_arguments
    exc = UsageError(f"{msg}\n\n{parser.format_usage()}Try {help_name(magic_func)}? for help.")
    exc.with_usage = True  # type: ignore[attr-defined]  # reported() leaves it as it is
    return exc


def print_usage(magic_func: Callable[..., Any], msg: str) -> None:
    """``UsageError: msg``, the magic's usage line and where its help is, on stderr (as IPython shows it)."""
    print(f"UsageError: {usage_error(magic_func, msg)}", file=sys.stderr)


def shown_short(exc: BaseException, msg: str | None = None) -> BaseException:
    """``exc`` with a ``_render_traceback_`` that IPython calls instead of formatting its traceback: one line,
    ``ClusterError: <message>`` (never our internals' frames). Returns ``exc``, to be raised."""
    text = str(exc) if msg is None else msg
    lines = [f"{type(exc).__name__}: {text}"]
    exc._render_traceback_ = lambda: list(lines)  # type: ignore[attr-defined]
    return exc


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


def missing_extra(exc: ImportError) -> str | None:
    """The message for an optional dependency that is not installed; ``None`` when ``exc`` is not one (a bug).

    An ImportError without a module name is one the library raised on purpose; its message says what to install.
    """
    if exc.name is None:
        return str(exc)
    extra = EXTRAS.get(exc.name.partition(".")[0])
    if extra is None:
        return None
    msg = str(exc)
    return msg if "pip install" in msg else f"{msg}: pip install 'gpu_notebook[{extra}]'"


class reported:
    """Around a magic's body: our failures fail the cell with one short message (see the module docstring);
    bugs keep their traceback.

    Used as ``with reported(self.gpu_cost): return self._cmd_show(args)``.

    Parameters
    ----------
    magic_func
        The magic, for its usage line.
    strip_quotes
        Strip quotes around the message (a ``KeyError``'s text is quoted).
    """

    def __init__(self, magic_func: Callable[..., Any], strip_quotes: bool = False) -> None:
        self.magic_func = magic_func
        self.strip_quotes = strip_quotes

    def __enter__(self) -> reported:
        return self

    def __exit__(
        self, etype: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Literal[False]:
        if exc is None:
            return False
        if isinstance(exc, UsageError):
            if type(exc) is UsageError and getattr(exc, "with_usage", False):
                return False
            raise usage_error(self.magic_func, str(exc)) from None
        if hasattr(exc, "_render_traceback_"):
            return False  # an error with its own display (DistributedError's per-rank report) keeps it
        if isinstance(exc, GpuNotebookError):
            msg = str(exc)
            shown_short(exc, msg.strip("'\"") if self.strip_quotes else msg)
            return False
        if isinstance(exc, ImportError):
            missing = missing_extra(exc)
            if missing is not None:
                raise shown_short(MissingExtra(missing)) from None
        return False


@contextmanager
def usage_errors(*types: type[Exception]) -> Iterator[None]:
    """Inside, one of ``types`` (not one of ours) means a value the user typed is wrong: a UsageError.

    For the one library call whose documented ``ValueError`` is about its arguments (``Cluster(workers=0)``).
    """
    try:
        yield
    except GpuNotebookError:
        raise
    except types as exc:
        raise UsageError(str(exc)) from None


@dataclass(frozen=True)
class Option:
    """One magic option: what ``@argument`` takes, kept so the magic knows each option's default and name."""

    flags: tuple[str, ...]  # "--workers", "-n"
    kwargs: dict[str, Any] = field(default_factory=dict)  # argparse's keywords (type, default, help, ...)

    @property
    def dest(self) -> str:
        """The attribute of the parsed arguments."""
        return str(self.kwargs.get("dest") or self.flag.lstrip("-").replace("-", "_"))

    @property
    def flag(self) -> str:
        """The long form, as the usage says it."""
        return max(self.flags, key=len)

    @property
    def default(self) -> Any:
        """The value when the option is not given."""
        if "default" in self.kwargs:
            return self.kwargs["default"]
        return False if self.kwargs.get("action") == "store_true" else None


def option(*flags: str, **kwargs: Any) -> Option:
    """An :class:`Option`: ``option("--workers", "-n", type=int, help=...)``, as ``@argument`` is called."""
    return Option(tuple(flags), dict(kwargs))


def options(*opts: Option) -> Callable[[F], F]:
    """A decorator that adds a group of options to a magic (in this order in its help), as ``@argument`` each."""

    def add(func: F) -> F:
        for opt in reversed(opts):  # @argument decorators apply bottom-up and are listed top-down
            func = argument(*opt.flags, **opt.kwargs)(func)
        return func

    return add


def progress_printer() -> Callable[[str], None]:
    """A progress callback that prints each stage with the elapsed time."""
    t0 = time.monotonic()

    def say(msg: str) -> None:
        print(f"[{time.monotonic() - t0:6.1f}s] {msg}", flush=True)

    return say


def error(msg: str) -> None:
    """``Error: msg`` on stderr: for a note that does not fail the cell (a failure raises instead)."""
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


__all__ = [
    "EXTRAS",
    "BadArguments",
    "MagicError",
    "MissingExtra",
    "Option",
    "error",
    "help_name",
    "missing_extra",
    "option",
    "options",
    "parse",
    "print_usage",
    "progress_printer",
    "reported",
    "show",
    "shown_short",
    "usage_error",
    "usage_errors",
]
